/*
 * bench_store.c -- `kvpool bench store`: batch put/get throughput of the
 * store's data plane, measured in one run next to the physical limits of
 * this host and next to two well-known peers.
 *
 * Shapes: 64 x 512 KiB and 16 x 2 MiB values (32 MiB per batch each).
 * For every shape and system, one warm-up batch (untimed; its bytes are read
 * back and compared with what was put) and then --rounds timed batches
 * (default 20; a cell stops early once it has 3 rounds and CELL_NS of
 * batch time): a batch of fresh keys is put, then got back into a separate
 * buffer. GB/s = batch bytes x rounds / summed batch time (10^9 B/s); p50 is
 * the median time of one batch. Removing a round's keys (or flushing a
 * peer) between rounds keeps the segment from filling and is not timed.
 * Source and destination buffers are written before any timing: the first
 * touch of fresh memory runs at ~0.4 GB/s and would dominate.
 *
 * Systems (rows):
 *   memcpy       single-thread memcpy of the same pieces, best round: the
 *                ceiling of the shared-memory path (a put or a get is one copy)
 *   raw TCP xN   N = BENCH_CONNS loopback connections, a sender and a receiver
 *                thread per connection, values spread over the connections
 *                as the kvpool batch spreads them (value i on connection
 *                i mod N): the ceiling of the TCP path. Its "put" and "get"
 *                are two measurements of the same one-way stream.
 *   kvpool shm   kvp_client_batch_put_from_multi_buffers and
 *                kvp_client_batch_get_into_multi_buffers (one piece per
 *                value) on a client on the node's host (segment mapped from
 *                the node's memfd)
 *   kvpool tcp   the same with KVPOOL_FORCE_TCP=1 at kvp_client_open
 *   redis        redis-server (no persistence) started on a free loopback
 *                port; pipelined SET/GET over BENCH_CONNS connections,
 *                values spread like the kvpool batch; FLUSHALL between rounds
 *   memcached    memcached -t 2 likewise, text protocol set/get; flush_all
 *   kvpool ucx-tcp, kvpool ucx-sm
 *                the kvpool rows again through the ucx transport (the
 *                spawned serve runs --protocol ucx; clients protocol "ucx",
 *                KVPOOL_FORCE_UCX=1) over UCX's TCP transport, then over its
 *                shared-memory transports (UCX_TLS=tcp / sm for the client)
 *   perftest tcp, perftest sm
 *                ucx_perftest (Debian ucx-utils), a server and a client
 *                process with the same UCX_TLS: ucp_put_bw and ucp_get, as
 *                many bytes as the kvpool cells moved, in messages of the
 *                value size over tcp and of a batch's 32 MiB over sm (a
 *                value-sized message would come from the cache, perftest
 *                reusing one buffer): UCX's own ceiling for those transports
 * Targets: kvpool shm >= 0.85 x memcpy; kvpool tcp >= 0.85 x raw TCP and
 * ahead of redis and memcached; kvpool ucx >= 0.8 x ucx_perftest on the same
 * transport; put and get, both shapes. ucx-tcp / tcp is shown, no target.
 *
 * --contend N starts N busy processes (a spinning loop each, ended with the
 * run) before the first cell: every row is then measured while they hold
 * cores, as on an engine host whose cores are busy.
 *
 * It starts `kvpool serve` (master + storage node, 1 GiB segment) itself
 * unless --master names a running master. A peer that is not installed is
 * reported as skipped; one that fails is reported as failed and does not
 * stop the run. Exit status 1 if a kvpool, memcpy or raw TCP cell failed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include "bench/bench.h"
#include "cli/cli.h"
#include "common/clock.h"
#include "common/mem.h"
#include "common/ucx.h"
#include "kvpool.h"

/* Connections per storage node of the kvpool TCP path: kvp_xfer's default
 * conns_per_node (src/client/xfer.h, "0 = 4"). The raw TCP baseline and the
 * peers use the same number. */
#define BENCH_CONNS 4
#define BATCH_BYTES ((size_t)32 << 20)
#define MAX_VALUES 64
#define KEYCAP 96
#define CMDCAP 256                       /* one peer command header */
#define CELL_NS 2000000000ull            /* per-cell time bound, after 3 rounds */
#define SEGMENT_SIZE "1GiB"

typedef struct shape {
    const char *name, *title;
    uint32_t n;
    size_t size;
} shape;

static const shape shapes[] = {
    {"64x512KiB", "64 x 512 KiB", 64, (size_t)512 << 10},
    {"16x2MiB", "16 x 2 MiB", 16, (size_t)2 << 20},
};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))

enum {
    SYS_MEMCPY, SYS_RAW, SYS_SHM, SYS_TCP, SYS_REDIS, SYS_MEMCACHED,
    SYS_UCX_TCP, SYS_UCX_SM, SYS_PERF_TCP, SYS_PERF_SM, NSYS
};
static const char *const sys_id[NSYS] = {"memcpy",         "raw_tcp",    "kvpool_shm",
                                         "kvpool_tcp",     "redis",      "memcached",
                                         "kvpool_ucx_tcp", "kvpool_ucx_sm", "ucx_perftest_tcp",
                                         "ucx_perftest_sm"};
/* the UCX_TLS of the ucx rows (SYS_UCX_TCP + i, SYS_PERF_TCP + i) */
static const char *const ucx_tls[2] = {"tcp", "sm"};

enum { CELL_NONE, CELL_OK, CELL_SKIP, CELL_FAIL };
static const char *const state_name[] = {"not run", "ok", "skipped", "failed"};

typedef struct cell {
    int state;
    int rounds;
    double put_gbps, get_gbps, put_p50_us, get_p50_us;
    char why[192];
} cell;

typedef struct sb {
    uint8_t *src, *dst;           /* BATCH_BYTES each, touched before timing */
    int rounds;
    unsigned long long nonce, seq; /* keys: fresh every batch, unique per run */
    char keybuf[MAX_VALUES][KEYCAP];
    const char *keys[MAX_VALUES];
    uint64_t *put_ns, *get_ns;    /* per-round batch times */
    cell cells[NSYS][NSHAPES];
    char transport[2][16];        /* what the kvpool shm/tcp clients really use */
    FILE *out;                    /* table (stderr with --json) */
    int contend;                  /* --contend: busy processes */
    pid_t spin[64];               /* their pids (0: none) */
} sb;

/* ------------------------------------------------------------ helpers */

/* --contend: b->contend children that spin until killed (or until this
 * process dies: PR_SET_PDEATHSIG). 0, or -1 with the reason printed. */
static int spin_start(sb *b)
{
    for (int i = 0; i < b->contend; i++) {
        pid_t p = fork();
        if (p < 0) {
            fprintf(stderr, "kvpool bench store: --contend: fork failed\n");
            return -1;
        }
        if (p == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            volatile uint64_t n = 0;
            for (;;)
                n++;
        }
        b->spin[i] = p;
    }
    return 0;
}

static void spin_stop(sb *b)
{
    for (int i = 0; i < b->contend; i++)
        if (b->spin[i] > 0) {
            kill(b->spin[i], SIGKILL);
            waitpid(b->spin[i], NULL, 0);
            b->spin[i] = 0;
        }
}

static void make_keys(sb *b, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        snprintf(b->keybuf[i], KEYCAP, "kvpool-bench/store-%016llx@tp0@pcp0@dcp0@pp0@%020llu",
                 b->nonce, b->seq++);
        b->keys[i] = b->keybuf[i];
    }
}

static void fail(cell *c, const char *fmt, const char *what)
{
    c->state = CELL_FAIL;
    snprintf(c->why, sizeof c->why, fmt, what);
}

static void skip(cell *c, const char *fmt, const char *what)
{
    c->state = CELL_SKIP;
    snprintf(c->why, sizeof c->why, fmt, what);
}

/* Writes every byte of iov[0..cnt) (modifies the array). */
static int writev_all(int fd, struct iovec *iov, int cnt)
{
    while (cnt > 0) {
        ssize_t w = writev(fd, iov, cnt > 1024 ? 1024 : cnt);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        size_t left = (size_t)w;
        while (cnt > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++, cnt--;
        }
        if (cnt > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return 0;
}

static int read_all(int fd, void *p, size_t n)
{
    uint8_t *q = p;
    while (n) {
        ssize_t r = read(fd, q, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r == 0)
            errno = ECONNRESET;
        if (r <= 0)
            return -1;
        q += r, n -= (size_t)r;
    }
    return 0;
}

/* Buffered reader for the peers' replies: lines, then bulk bytes read
 * straight into the destination once the buffer is drained. */
typedef struct rdbuf {
    int fd;
    size_t beg, end;
    char b[65536];
} rdbuf;

static int rd_fill(rdbuf *r)
{
    if (r->beg == r->end)
        r->beg = r->end = 0;
    else if (r->end == sizeof r->b) {
        memmove(r->b, r->b + r->beg, r->end - r->beg);
        r->end -= r->beg, r->beg = 0;
    }
    for (;;) {
        ssize_t n = read(r->fd, r->b + r->end, sizeof r->b - r->end);
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0)
            errno = ECONNRESET;
        if (n <= 0)
            return -1;
        r->end += (size_t)n;
        return 0;
    }
}

/* One "\r\n"-terminated line, without the terminator, NUL-terminated. */
static int rd_line(rdbuf *r, char *line, size_t cap)
{
    size_t scanned = 0;
    for (;;) {
        char *s = r->b + r->beg;
        size_t have = r->end - r->beg;
        for (size_t i = scanned ? scanned - 1 : 0; i + 1 < have; i++)
            if (s[i] == '\r' && s[i + 1] == '\n') {
                size_t l = i < cap - 1 ? i : cap - 1;
                memcpy(line, s, l);
                line[l] = '\0';
                r->beg += i + 2;
                return 0;
            }
        scanned = have;
        if (have >= sizeof r->b) {
            errno = EMSGSIZE;
            return -1;
        }
        if (rd_fill(r))
            return -1;
    }
}

static int rd_exact(rdbuf *r, void *dst, size_t n)
{
    size_t have = r->end - r->beg, k = have < n ? have : n;
    memcpy(dst, r->b + r->beg, k);
    r->beg += k;
    return k == n ? 0 : read_all(r->fd, (uint8_t *)dst + k, n - k);
}

static int tcp_nodelay(int fd)
{
    int one = 1;
    return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* A loopback port nobody listens on now (bind port 0, read it, close). */
static int free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = -1;
    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &al) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static int connect_lo(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    tcp_nodelay(fd);
    return fd;
}

/* ------------------------------------------------------------ crew
 * A fixed set of worker threads that each run fn(arg, i) once per
 * crew_run; the threads live across rounds so that thread creation is not
 * part of any measurement. */
typedef struct crew crew;
typedef int (*crew_fn)(void *arg, int i, char *why, size_t wl);
typedef struct crew_arg {
    crew *w;
    int i;
} crew_arg;
struct crew {
    int n, stop, pending, inited;
    uint64_t gen;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    pthread_t th[2 * BENCH_CONNS];
    crew_arg ta[2 * BENCH_CONNS];
    crew_fn fn;
    void *arg;
    int rc[2 * BENCH_CONNS];
    char why[2 * BENCH_CONNS][160];
};

static void *crew_main(void *p)
{
    crew_arg *a = p;
    crew *w = a->w;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (w->gen == seen && !w->stop)
            pthread_cond_wait(&w->go, &w->mu);
        if (w->stop) {
            pthread_mutex_unlock(&w->mu);
            return NULL;
        }
        seen = w->gen;
        pthread_mutex_unlock(&w->mu);
        int rc = w->fn(w->arg, a->i, w->why[a->i], sizeof w->why[a->i]);
        pthread_mutex_lock(&w->mu);
        w->rc[a->i] = rc;
        if (--w->pending == 0)
            pthread_cond_signal(&w->done);
        pthread_mutex_unlock(&w->mu);
    }
}

static void crew_stop(crew *w)
{
    if (!w->inited)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_broadcast(&w->go);
    pthread_mutex_unlock(&w->mu);
    for (int i = 0; i < w->n; i++)
        pthread_join(w->th[i], NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->go);
    pthread_cond_destroy(&w->done);
    w->inited = 0;
    w->n = 0;
}

static int crew_start(crew *w, int n, crew_fn fn, void *arg)
{
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->go, NULL);
    pthread_cond_init(&w->done, NULL);
    w->inited = 1;
    w->fn = fn;
    w->arg = arg;
    for (int i = 0; i < n; i++) {
        w->ta[i].w = w;
        w->ta[i].i = i;
        if (pthread_create(&w->th[i], NULL, crew_main, &w->ta[i]) != 0) {
            crew_stop(w);
            return -1;
        }
        w->n++;
    }
    return 0;
}

/* Runs every worker once; 0, or -1 with the first worker's message. */
static int crew_run(crew *w, char *why, size_t wl)
{
    pthread_mutex_lock(&w->mu);
    w->gen++;
    w->pending = w->n;
    pthread_cond_broadcast(&w->go);
    while (w->pending)
        pthread_cond_wait(&w->done, &w->mu);
    pthread_mutex_unlock(&w->mu);
    for (int i = 0; i < w->n; i++)
        if (w->rc[i]) {
            snprintf(why, wl, "%s", w->why[i]);
            return -1;
        }
    return 0;
}

/* ------------------------------------------------------------ cells */

typedef int (*batch_fn)(sb *b, void *sys, const shape *s, int is_put, char *why, size_t wl);
typedef int (*clean_fn)(sb *b, void *sys, const shape *s, char *why, size_t wl);

static int verify(sb *b, const shape *s, char *why, size_t wl)
{
    for (uint32_t i = 0; i < s->n; i++)
        if (memcmp(b->src + i * s->size, b->dst + i * s->size, s->size) != 0) {
            snprintf(why, wl, "value %u read back differs from what was put", i);
            return -1;
        }
    return 0;
}

static void summarize(sb *b, const shape *s, int done, cell *c)
{
    uint64_t put = 0, get = 0;
    for (int i = 0; i < done; i++)
        put += b->put_ns[i], get += b->get_ns[i];
    double bytes = (double)s->n * (double)s->size * done;
    qsort(b->put_ns, (size_t)done, sizeof *b->put_ns, kvp_bench_cmp_u64);
    qsort(b->get_ns, (size_t)done, sizeof *b->get_ns, kvp_bench_cmp_u64);
    c->state = CELL_OK;
    c->rounds = done;
    c->put_gbps = put ? bytes / (double)put : 0;
    c->get_gbps = get ? bytes / (double)get : 0;
    c->put_p50_us = (double)b->put_ns[done / 2] / 1e3;
    c->get_p50_us = (double)b->get_ns[done / 2] / 1e3;
}

/* The measurement loop shared by every system but memcpy: a verified
 * warm-up batch, then timed rounds of put-batch + get-batch; clean (untimed)
 * after each round. */
static void run_cell(sb *b, const char *label, batch_fn fn, clean_fn clean, void *sys,
                     const shape *s, cell *c)
{
    char why[160];
    int done = 0;
    uint64_t spent = 0;
    for (int r = -1; r < b->rounds; r++) {
        kvp_bench_progress(label, 12, s->name, 10, r, b->rounds);
        make_keys(b, s->n);
        if (r < 0)
            memset(b->dst, 0, BATCH_BYTES);
        uint64_t t0 = kvp_now_ns();
        if (fn(b, sys, s, 1, why, sizeof why)) {
            kvp_bench_progress_clear(60);
            fail(c, "put: %s", why);
            return;
        }
        uint64_t t1 = kvp_now_ns();
        if (fn(b, sys, s, 0, why, sizeof why)) {
            kvp_bench_progress_clear(60);
            fail(c, "get: %s", why);
            return;
        }
        uint64_t t2 = kvp_now_ns();
        if (r < 0 && verify(b, s, why, sizeof why)) {
            kvp_bench_progress_clear(60);
            fail(c, "%s", why);
            return;
        }
        if (r >= 0) {
            b->put_ns[done] = t1 - t0;
            b->get_ns[done] = t2 - t1;
            spent += t2 - t0;
            done++;
        }
        if (clean && clean(b, sys, s, why, sizeof why)) {
            kvp_bench_progress_clear(60);
            fail(c, "between rounds: %s", why);
            return;
        }
        if (done >= 3 && spent > CELL_NS)
            break;
    }
    kvp_bench_progress_clear(60);
    summarize(b, s, done, c);
}

/* memcpy: one thread copies the batch's pieces from src to dst; the best
 * round's GB/s stands for both put and get (each is one copy of every
 * byte); p50 is the median round. */
static void bench_memcpy(sb *b, const shape *s, cell *c)
{
    int rounds = b->rounds < 5 ? 5 : b->rounds;
    uint64_t best = UINT64_MAX;
    memset(b->dst, 0, BATCH_BYTES);
    for (int r = 0; r < rounds; r++) {
        kvp_bench_progress("memcpy", 12, s->name, 10, r, rounds);
        uint64_t t0 = kvp_now_ns();
        for (uint32_t i = 0; i < s->n; i++)
            memcpy(b->dst + i * s->size, b->src + i * s->size, s->size);
        __asm__ __volatile__("" ::: "memory");
        uint64_t t = kvp_now_ns() - t0;
        if (t < best)
            best = t;
        b->put_ns[r] = t;
    }
    kvp_bench_progress_clear(60);
    char why[160];
    if (verify(b, s, why, sizeof why)) {
        fail(c, "%s", why);
        return;
    }
    double bytes = (double)s->n * (double)s->size;
    c->state = CELL_OK;
    c->rounds = rounds;
    c->put_gbps = c->get_gbps = bytes / (double)best;
    qsort(b->put_ns, (size_t)rounds, sizeof *b->put_ns, kvp_bench_cmp_u64);
    c->put_p50_us = c->get_p50_us = (double)b->put_ns[rounds / 2] / 1e3;
}

/* ------------------------------------------------------------ raw TCP
 * BENCH_CONNS loopback connections; worker i < N sends the values
 * v = i, i+N, ... from src on connection i, worker N+i receives them into
 * the same offsets of dst. One "batch" moves every value once. */
typedef struct raw {
    crew w;
    int snd[BENCH_CONNS], rcv[BENCH_CONNS];
    sb *b;
    const shape *s;
} raw;

static int raw_work(void *arg, int i, char *why, size_t wl)
{
    raw *x = arg;
    int conn = i % BENCH_CONNS, sender = i < BENCH_CONNS;
    for (uint32_t v = (uint32_t)conn; v < x->s->n; v += BENCH_CONNS) {
        size_t off = v * x->s->size;
        int rc = sender ? kvp_bench_write_all(x->snd[conn], x->b->src + off, x->s->size)
                        : read_all(x->rcv[conn], x->b->dst + off, x->s->size);
        if (rc) {
            snprintf(why, wl, "%s on connection %d: %s", sender ? "send" : "receive", conn,
                     strerror(errno));
            return -1;
        }
    }
    return 0;
}

static int raw_batch(sb *b, void *sys, const shape *s, int is_put, char *why, size_t wl)
{
    raw *x = sys;
    x->b = b;
    x->s = s;
    return crew_run(&x->w, why, wl);
}

static void raw_close(raw *x)
{
    crew_stop(&x->w);
    for (int i = 0; i < BENCH_CONNS; i++) {
        if (x->snd[i] >= 0)
            close(x->snd[i]);
        if (x->rcv[i] >= 0)
            close(x->rcv[i]);
    }
}

static int raw_open(raw *x, char *why, size_t wl)
{
    for (int i = 0; i < BENCH_CONNS; i++)
        x->snd[i] = x->rcv[i] = -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, BENCH_CONNS) ||
        getsockname(ls, (struct sockaddr *)&a, &al)) {
        snprintf(why, wl, "listen on loopback: %s", strerror(errno));
        if (ls >= 0)
            close(ls);
        return -1;
    }
    /* connect then accept one at a time: accepted socket i is the peer of
     * connected socket i */
    for (int i = 0; i < BENCH_CONNS; i++) {
        x->snd[i] = connect_lo(ntohs(a.sin_port));
        x->rcv[i] = x->snd[i] < 0 ? -1 : accept4(ls, NULL, NULL, SOCK_CLOEXEC);
        if (x->rcv[i] < 0) {
            snprintf(why, wl, "loopback connection: %s", strerror(errno));
            close(ls);
            raw_close(x);
            return -1;
        }
        tcp_nodelay(x->rcv[i]);
    }
    close(ls);
    if (crew_start(&x->w, 2 * BENCH_CONNS, raw_work, x)) {
        snprintf(why, wl, "cannot start threads");
        raw_close(x);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ peers
 * redis-server and memcached, each started on a free loopback port. Worker
 * i handles the values v = i, i+N, ... on connection i: it writes every
 * command of the batch (writev; values straight from src), then reads the
 * replies (values straight into dst). Replies to SET are small and GET
 * requests are small, so writing everything first cannot deadlock. */
enum { PEER_REDIS, PEER_MEMCACHED };

typedef struct peer {
    int kind;
    pid_t pid;
    int fd[BENCH_CONNS];
    rdbuf *rd[BENCH_CONNS];
    char *cmd[BENCH_CONNS]; /* command headers, CMDCAP per value */
    crew w;
    sb *b;
    const shape *s;
    int is_put;
} peer;

static int peer_reply(peer *p, int c, uint32_t v, char *why, size_t wl)
{
    char line[512];
    const shape *s = p->s;
    rdbuf *r = p->rd[c];
    if (rd_line(r, line, sizeof line))
        goto io;
    if (p->is_put) {
        if (strcmp(line, p->kind == PEER_REDIS ? "+OK" : "STORED") != 0) {
            snprintf(why, wl, "set answered \"%.100s\"", line);
            return -1;
        }
        return 0;
    }
    unsigned long long len = 0;
    unsigned flags;
    char key[KEYCAP + 8];
    int ok = p->kind == PEER_REDIS
                 ? sscanf(line, "$%llu", &len) == 1
                 : sscanf(line, "VALUE %100s %u %llu", key, &flags, &len) == 3;
    if (!ok || len != s->size) {
        snprintf(why, wl, "get answered \"%.100s\" (expected a %zu-byte value)", line, s->size);
        return -1;
    }
    if (rd_exact(r, p->b->dst + v * s->size, s->size) || rd_line(r, line, sizeof line))
        goto io;
    if (line[0] || (p->kind == PEER_MEMCACHED && (rd_line(r, line, sizeof line) ||
                                                  strcmp(line, "END") != 0))) {
        snprintf(why, wl, "get: unexpected \"%.100s\" after the value", line);
        return -1;
    }
    return 0;
io:
    snprintf(why, wl, "connection %d: %s", c, strerror(errno));
    return -1;
}

static int peer_work(void *arg, int c, char *why, size_t wl)
{
    peer *p = arg;
    const shape *s = p->s;
    struct iovec iov[3 * MAX_VALUES];
    int ni = 0;
    size_t off = 0;
    int redis = p->kind == PEER_REDIS;
    for (uint32_t v = (uint32_t)c; v < s->n; v += BENCH_CONNS) {
        const char *k = p->b->keys[v];
        char *h = p->cmd[c] + off;
        int hl;
        if (p->is_put) {
            hl = redis ? snprintf(h, CMDCAP, "*3\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%zu\r\n",
                                  strlen(k), k, s->size)
                       : snprintf(h, CMDCAP, "set %s 0 0 %zu\r\n", k, s->size);
            iov[ni++] = (struct iovec){h, (size_t)hl};
            iov[ni++] = (struct iovec){p->b->src + v * s->size, s->size};
            iov[ni++] = (struct iovec){(void *)"\r\n", 2};
        } else {
            hl = redis ? snprintf(h, CMDCAP, "*2\r\n$3\r\nGET\r\n$%zu\r\n%s\r\n", strlen(k), k)
                       : snprintf(h, CMDCAP, "get %s\r\n", k);
        }
        off += (size_t)hl;
    }
    if (!p->is_put)
        iov[ni++] = (struct iovec){p->cmd[c], off};
    if (writev_all(p->fd[c], iov, ni)) {
        snprintf(why, wl, "connection %d: %s", c, strerror(errno));
        return -1;
    }
    for (uint32_t v = (uint32_t)c; v < s->n; v += BENCH_CONNS)
        if (peer_reply(p, c, v, why, wl))
            return -1;
    return 0;
}

static int peer_batch(sb *b, void *sys, const shape *s, int is_put, char *why, size_t wl)
{
    peer *p = sys;
    p->b = b;
    p->s = s;
    p->is_put = is_put;
    return crew_run(&p->w, why, wl);
}

/* One command on connection 0 with a one-line answer. */
static int peer_cmd(peer *p, const char *cmd, const char *want, char *why, size_t wl)
{
    char line[256];
    if (kvp_bench_write_all(p->fd[0], cmd, strlen(cmd)) || rd_line(p->rd[0], line, sizeof line)) {
        snprintf(why, wl, "%s", strerror(errno));
        return -1;
    }
    if (strncmp(line, want, strlen(want)) != 0) {
        snprintf(why, wl, "answered \"%.100s\" to %.*s", line, (int)strcspn(cmd, "\r"), cmd);
        return -1;
    }
    return 0;
}

static int peer_flush(sb *b, void *sys, const shape *s, char *why, size_t wl)
{
    peer *p = sys;
    return p->kind == PEER_REDIS ? peer_cmd(p, "FLUSHALL\r\n", "+OK", why, wl)
                                 : peer_cmd(p, "flush_all\r\n", "OK", why, wl);
}

/* $PATH, then /usr/bin and /usr/sbin. */
static int find_exe(const char *name, char *out, size_t cap)
{
    const char *path = getenv("PATH");
    char dirs[4096];
    snprintf(dirs, sizeof dirs, "%s:/usr/bin:/usr/sbin", path ? path : "");
    for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(out, cap, "%s/%s", *d ? d : ".", name);
        if (access(out, X_OK) == 0)
            return 0;
    }
    return -1;
}

static void peer_stop(peer *p)
{
    crew_stop(&p->w);
    for (int i = 0; i < BENCH_CONNS; i++) {
        if (p->fd[i] >= 0)
            close(p->fd[i]);
        kvp_free(p->rd[i]);
        kvp_free(p->cmd[i]);
        p->fd[i] = -1, p->rd[i] = NULL, p->cmd[i] = NULL;
    }
    if (p->pid > 0) {
        kill(p->pid, SIGTERM);
        waitpid(p->pid, NULL, 0);
        p->pid = 0;
    }
}

/* 0 started, 1 not installed (why says so), -1 failed. */
static int peer_start(peer *p, int kind, char *why, size_t wl)
{
    const char *name = kind == PEER_REDIS ? "redis-server" : "memcached";
    char exe[512], port[16];
    p->kind = kind;
    p->pid = 0;
    for (int i = 0; i < BENCH_CONNS; i++)
        p->fd[i] = -1;
    if (find_exe(name, exe, sizeof exe)) {
        snprintf(why, wl, "%s not found in $PATH, /usr/bin or /usr/sbin", name);
        return 1;
    }
    int pn = free_port();
    if (pn < 0) {
        snprintf(why, wl, "no free loopback port: %s", strerror(errno));
        return -1;
    }
    snprintf(port, sizeof port, "%d", pn);
    const char *redis_argv[] = {name, "--port", port, "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no", "--protected-mode", "no", "--daemonize",
                                "no", NULL};
    /* memcached refuses to run as root without -u */
    const char *mc_argv[] = {name, "-p", port, "-l", "127.0.0.1", "-U", "0", "-m", "2048",
                             "-I", "4m", "-t", "2", geteuid() == 0 ? "-u" : NULL, "root", NULL};
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, wl, "fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        int dn = open("/dev/null", O_RDWR);
        if (dn >= 0) {
            dup2(dn, 0), dup2(dn, 1), dup2(dn, 2);
            if (dn > 2)
                close(dn);
        }
        execv(exe, (char *const *)(kind == PEER_REDIS ? redis_argv : mc_argv));
        _exit(127);
    }
    p->pid = pid;
    int fd = -1, st;
    for (int i = 0; i < 500 && fd < 0; i++) { /* up to 10 s */
        if (waitpid(pid, &st, WNOHANG) == pid) {
            p->pid = 0;
            snprintf(why, wl, "%.120s exited at start (status %d)", exe,
                     WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
            return -1;
        }
        if ((fd = connect_lo(pn)) < 0)
            usleep(20000);
    }
    if (fd < 0) {
        snprintf(why, wl, "%.120s did not accept on port %d within 10 s", exe, pn);
        peer_stop(p);
        return -1;
    }
    p->fd[0] = fd;
    for (int i = 0; i < BENCH_CONNS; i++) {
        if (i && (p->fd[i] = connect_lo(pn)) < 0) {
            snprintf(why, wl, "connect to %s: %s", name, strerror(errno));
            peer_stop(p);
            return -1;
        }
        p->rd[i] = kvp_malloc(sizeof *p->rd[i]);
        p->cmd[i] = kvp_malloc((size_t)CMDCAP * MAX_VALUES);
        if (!p->rd[i] || !p->cmd[i]) {
            snprintf(why, wl, "out of memory");
            peer_stop(p);
            return -1;
        }
        p->rd[i]->fd = p->fd[i];
        p->rd[i]->beg = p->rd[i]->end = 0;
    }
    char e[160];
    if (kind == PEER_REDIS ? peer_cmd(p, "PING\r\n", "+PONG", e, sizeof e)
                           : peer_cmd(p, "version\r\n", "VERSION", e, sizeof e)) {
        snprintf(why, wl, "%s: %s", name, e);
        peer_stop(p);
        return -1;
    }
    if (crew_start(&p->w, BENCH_CONNS, peer_work, p)) {
        snprintf(why, wl, "cannot start threads");
        peer_stop(p);
        return -1;
    }
    return 0;
}

static void bench_peer(sb *b, int kind, int sys)
{
    peer p;
    memset(&p, 0, sizeof p);
    char why[192];
    int rc = peer_start(&p, kind, why, sizeof why);
    for (int si = 0; si < NSHAPES; si++) {
        cell *c = &b->cells[sys][si];
        if (rc) {
            c->state = rc > 0 ? CELL_SKIP : CELL_FAIL;
            snprintf(c->why, sizeof c->why, "%s", why);
            continue;
        }
        run_cell(b, kind == PEER_REDIS ? "redis" : "memcached", peer_batch, peer_flush, &p,
                 &shapes[si], c);
    }
    if (rc == 0)
        peer_stop(&p);
}

/* ------------------------------------------------------------ kvpool */

static int kv_batch(sb *b, void *sys, const shape *s, int is_put, char *why, size_t wl)
{
    kvp_client *c = sys;
    kvp_iov iov[MAX_VALUES];
    const kvp_iov *iovs[MAX_VALUES];
    size_t niov[MAX_VALUES];
    int64_t res[MAX_VALUES];
    for (uint32_t i = 0; i < s->n; i++) {
        iov[i].base = (is_put ? b->src : b->dst) + i * s->size;
        iov[i].len = s->size;
        iovs[i] = &iov[i];
        niov[i] = 1;
    }
    int rc = is_put ? kvp_client_batch_put_from_multi_buffers(c, b->keys, iovs, niov, s->n, res)
                    : kvp_client_batch_get_into_multi_buffers(c, b->keys, iovs, niov, s->n, res);
    if (rc < 0) {
        snprintf(why, wl, "%s", kvp_strerror(rc));
        return -1;
    }
    for (uint32_t i = 0; i < s->n; i++)
        if (res[i] != (int64_t)s->size) {
            if (res[i] < 0)
                snprintf(why, wl, "key %u: %s", i, kvp_strerror((int)res[i]));
            else
                snprintf(why, wl, "key %u: %lld of %zu bytes moved", i, (long long)res[i],
                         s->size);
            return -1;
        }
    return 0;
}

/* Removes the round's keys (force: a get's lease may still be held). */
static int kv_clean(sb *b, void *sys, const shape *s, char *why, size_t wl)
{
    for (uint32_t i = 0; i < s->n; i++) {
        int rc = kvp_client_remove(sys, b->keys[i], 1);
        if (rc && rc != KVP_EOBJECT_NOT_FOUND) {
            snprintf(why, wl, "remove: %s", kvp_strerror(rc));
            return -1;
        }
    }
    return 0;
}


/* Opens a standalone-store client (TCP-only when force_tcp), waits until a
 * put succeeds (the node may still be mounting its segment), and records
 * the transport the client actually uses for it (from kvp_client_describe). */
static kvp_client *kv_open(sb *b, const char *master, const char *token, int force_tcp,
                           char *transport, char *why, size_t wl)
{
    kvp_client *c = kvp_bench_client_open(master, token, force_tcp, why, wl);
    if (!c)
        return NULL;
    char probe[KEYCAP];
    snprintf(probe, sizeof probe, "kvpool-bench/store-%016llx@probe%d", b->nonce, force_tcp);
    if (kvp_bench_client_probe(c, probe, b->src, transport, why, wl) != 0) {
        kvp_client_close(c);
        return NULL;
    }
    return c;
}

/* Starts `kvpool serve` (master + storage node, same binary) on a free
 * loopback port; up to 30 s: the node maps its segment first. Its pages are
 * faulted in before it serves (--segment-prefault sync), as this benchmark's
 * own buffers are written before any timing: with the default (background)
 * the node's prefault thread would fault the 1 GiB in -- ~3 s of a core at
 * first-touch speed -- while the kvpool rows are measured. */
static pid_t spawn_serve(char *addr, size_t addrlen)
{
    static const char *const args[] = {"serve",      "--segment-size",
                                       SEGMENT_SIZE, "--segment-prefault",
                                       "sync",       "--log-level",
                                       "warn",       "--protocol",
                                       "ucx",        NULL};
    /* the node offers UCX over both transports the ucx rows use (a node
     * without UCX serves shm and tcp: those rows then fail, said why) */
    char *old = getenv("UCX_TLS") ? strdup(getenv("UCX_TLS")) : NULL;
    setenv("UCX_TLS", "tcp,sm", 1);
    pid_t pid = kvp_cli_spawn_self(args, 30000, addr, addrlen);
    if (old)
        setenv("UCX_TLS", old, 1);
    else
        unsetenv("UCX_TLS");
    free(old);
    return pid;
}

static void bench_kvpool(sb *b, const char *master, const char *token)
{
    for (int t = 0; t < 2; t++) {
        int sys = t ? SYS_TCP : SYS_SHM;
        char why[192];
        kvp_client *c = kv_open(b, master, token, t, b->transport[t], why, sizeof why);
        for (int si = 0; si < NSHAPES; si++) {
            if (!c) {
                b->cells[sys][si].state = CELL_FAIL;
                snprintf(b->cells[sys][si].why, sizeof b->cells[sys][si].why, "%s", why);
                continue;
            }
            run_cell(b, t ? "kvpool tcp" : "kvpool shm", kv_batch, kv_clean, c, &shapes[si],
                     &b->cells[sys][si]);
        }
        if (c)
            kvp_client_close(c);
    }
}

/* The ucx rows: a client per UCX transport (UCX_TLS read when its UCX
 * context is made, at its first ucx segment), forced onto UCX for this
 * host's node. A client whose probe did not go through UCX fails its row. */
static void bench_ucx(sb *b, const char *master, const char *token)
{
    char m[300], t[300], conf[800], why[192], via[16];
    kvp_bench_json_escape(m, sizeof m, master);
    kvp_bench_json_escape(t, sizeof t, token ? token : "");
    snprintf(conf, sizeof conf,
             "{\"master\": \"%s\", \"mode\": \"standalone-store\", \"protocol\": \"ucx\"%s%s%s}",
             m, *t ? ", \"cluster_token\": \"" : "", t, *t ? "\"" : "");
    for (int i = 0; i < 2; i++) {
        int sys = SYS_UCX_TCP + i;
        setenv("UCX_TLS", ucx_tls[i], 1);
        setenv("KVPOOL_FORCE_UCX", "1", 1);
        kvp_client *c = kvp_bench_client_open_conf(conf, 0, why, sizeof why);
        char probe[KEYCAP];
        snprintf(probe, sizeof probe, "kvpool-bench/store-%016llx@probe-ucx%d", b->nonce, i);
        if (c && kvp_bench_client_probe(c, probe, b->src, via, why, sizeof why) != 0) {
            kvp_client_close(c);
            c = NULL;
        }
        if (c && strcmp(via, "ucx") != 0) {
            snprintf(why, sizeof why, "the client used %s, not ucx (see the warnings above)", via);
            kvp_client_close(c);
            c = NULL;
        }
        for (int si = 0; si < NSHAPES; si++) {
            if (!c) {
                fail(&b->cells[sys][si], "%s", why);
                continue;
            }
            run_cell(b, i ? "kvpool ucx-sm" : "kvpool ucx-tcp", kv_batch, kv_clean, c,
                     &shapes[si], &b->cells[sys][si]);
        }
        if (c)
            kvp_client_close(c);
        unsetenv("KVPOOL_FORCE_UCX");
        unsetenv("UCX_TLS");
    }
}

/* One ucx_perftest run (server and client processes, UCX_TLS=tls) of
 * `test` with n messages of `size` bytes: the client's overall bandwidth in
 * GB/s (10^9 B/s; perftest prints MB/s of 2^20 B), or < 0 with why. */
static double perftest(const char *exe, const char *tls, const char *test, size_t size,
                       unsigned n, char *why, size_t wl)
{
    int port = free_port();
    if (port < 0) {
        snprintf(why, wl, "no free port");
        return -1;
    }
    char ps[16], ss[32], ns[16];
    snprintf(ps, sizeof ps, "%d", port);
    snprintf(ss, sizeof ss, "%zu", size);
    snprintf(ns, sizeof ns, "%u", n);
    pid_t srv = fork();
    if (srv == 0) {
        setenv("UCX_TLS", tls, 1);
        int dn = open("/dev/null", O_WRONLY);
        dup2(dn, 1);
        dup2(dn, 2);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl(exe, exe, "-p", ps, (char *)NULL);
        _exit(127);
    }
    if (srv < 0) {
        snprintf(why, wl, "fork: %s", strerror(errno));
        return -1;
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "UCX_TLS=%s timeout 120 %s 127.0.0.1 -p %s -t %s -s %s -n %s -w 8 2>&1", tls, exe, ps,
             test, ss, ns);
    double mbps = -1;
    char line[512], last[512] = "";
    for (int attempt = 0; attempt < 50 && mbps < 0; attempt++) { /* the server may not listen yet */
        usleep(100000);
        FILE *f = popen(cmd, "r");
        if (!f)
            break;
        while (fgets(line, sizeof line, f)) {
            double bw_avg, bw_all;
            unsigned long long it;
            double p50, lat, lat_all;
            if (sscanf(line, "Final: %llu %lf %lf %lf %lf %lf", &it, &p50, &lat, &lat_all, &bw_avg,
                       &bw_all) == 6)
                mbps = bw_all;
            else if (line[0] && line[0] != '+' && line[0] != '|')
                snprintf(last, sizeof last, "%s", line);
        }
        pclose(f);
        if (mbps < 0 && !strstr(last, "onnection refused") && !strstr(last, "onnect"))
            break;
    }
    kill(srv, SIGKILL);
    waitpid(srv, NULL, 0);
    if (mbps < 0) {
        last[strcspn(last, "\n")] = 0;
        snprintf(why, wl, "ucx_perftest %s: %s", test, last[0] ? last : "no result");
        return -1;
    }
    return mbps * 1048576.0 / 1e9;
}

/* The perftest rows: put and get bandwidth, as many batches' worth as the
 * kvpool ucx cell of that shape ran (at least 8). Messages: over tcp of the
 * shape's value size (what a kvpool op moves); over sm of a whole batch's
 * bytes, 32 MiB, from memory as the kvpool cells move them (a value-sized
 * message would be served from the CPU's cache, perftest reusing one
 * buffer; over tcp that does not matter, and perftest's tcp puts of 32 MiB
 * take about a second each). */
static void bench_perftest(sb *b)
{
    char exe[512], why[192];
    if (find_exe("ucx_perftest", exe, sizeof exe) != 0) {
        for (int i = 0; i < 2; i++)
            for (int si = 0; si < NSHAPES; si++)
                skip(&b->cells[SYS_PERF_TCP + i][si], "%s",
                     "ucx_perftest is not installed (Debian: ucx-utils)");
        return;
    }
    for (int i = 0; i < 2; i++)
        for (int si = 0; si < NSHAPES; si++) {
            const shape *sh = &shapes[si];
            cell *c = &b->cells[SYS_PERF_TCP + i][si];
            int batches = b->cells[SYS_UCX_TCP + i][si].rounds;
            unsigned n = (unsigned)(batches > 8 ? batches : 8);
            size_t bytes = (size_t)sh->n * sh->size;
            size_t msg = i ? bytes : sh->size;
            n = (unsigned)(n * (bytes / msg));
            kvp_bench_progress(i ? "perftest sm" : "perftest tcp", 12, sh->name, 10, 0, 1);
            double put = perftest(exe, ucx_tls[i], "ucp_put_bw", msg, n, why, sizeof why);
            double get = put < 0 ? -1 : perftest(exe, ucx_tls[i], "ucp_get", msg, n, why,
                                                 sizeof why);
            kvp_bench_progress_clear(60);
            if (get < 0) {
                fail(c, "%s", why);
                continue;
            }
            c->state = CELL_OK;
            c->rounds = (int)(n / (bytes / msg));
            c->put_gbps = put;
            c->get_gbps = get;
            c->put_p50_us = (double)bytes / put / 1e3; /* one batch's time at that rate */
            c->get_p50_us = (double)bytes / get / 1e3;
        }
}

/* ------------------------------------------------------------ report */

static const struct target {
    const char *name;
    int num, den;
    double min;
    int strict; /* > min instead of >= min */
} targets[] = {
    {"shm/memcpy", SYS_SHM, SYS_MEMCPY, 0.85, 0},
    {"tcp/raw_tcp", SYS_TCP, SYS_RAW, 0.85, 0},
    {"ucx-tcp/perftest", SYS_UCX_TCP, SYS_PERF_TCP, 0.8, 0},
    {"ucx-sm/perftest", SYS_UCX_SM, SYS_PERF_SM, 0.8, 0},
    {"ucx-tcp/tcp", SYS_UCX_TCP, SYS_TCP, 0, 0},
    {"tcp/redis", SYS_TCP, SYS_REDIS, 1.0, 1},
    {"tcp/memcached", SYS_TCP, SYS_MEMCACHED, 1.0, 1},
};
#define NTARGETS ((int)(sizeof targets / sizeof targets[0]))

/* The ratio for target t, shape si, put or get; < 0 when a cell is missing. */
static double ratio(const sb *b, const struct target *t, int si, int get)
{
    const cell *n = &b->cells[t->num][si], *d = &b->cells[t->den][si];
    if (n->state != CELL_OK || d->state != CELL_OK)
        return -1;
    double dv = get ? d->get_gbps : d->put_gbps;
    return dv > 0 ? (get ? n->get_gbps : n->put_gbps) / dv : -1;
}

static const char *met(const struct target *t, double r)
{
    if (r < 0)
        return "n/a";
    return (t->strict ? r > t->min : r >= t->min) ? "met" : "MISS";
}

static void print_table(const sb *b, const char *master, int spawned)
{
    FILE *o = b->out;
    char raw_name[32];
    snprintf(raw_name, sizeof raw_name, "raw TCP x%d", BENCH_CONNS);
    const char *names[NSYS] = {"memcpy",       raw_name,      "kvpool shm",
                               "kvpool tcp",   "redis",       "memcached",
                               "kvpool ucx-tcp", "kvpool ucx-sm", "perftest tcp",
                               "perftest sm"};
    fprintf(o, "kvpool bench store: master %s%s, %d rounds, %d connections, kvpool transports %s/%s, "
               "%d busy processes\n",
            master, spawned ? " (kvpool serve, segment " SEGMENT_SIZE ")" : "", b->rounds,
            BENCH_CONNS, b->transport[0], b->transport[1], b->contend);
    fprintf(o, "  %-14s", "");
    for (int si = 0; si < NSHAPES; si++)
        fprintf(o, "  %-38s", shapes[si].title);
    fprintf(o, "\n  %-14s", "system");
    for (int si = 0; si < NSHAPES; si++)
        fprintf(o, "  put GB/s  p50 ms  get GB/s  p50 ms    ");
    fprintf(o, "\n");
    for (int y = 0; y < NSYS; y++) {
        fprintf(o, "  %-14s", names[y]);
        for (int si = 0; si < NSHAPES; si++) {
            const cell *c = &b->cells[y][si];
            if (c->state == CELL_OK)
                fprintf(o, "  %8.2f %7.2f  %8.2f %7.2f    ", c->put_gbps, c->put_p50_us / 1e3,
                        c->get_gbps, c->get_p50_us / 1e3);
            else
                fprintf(o, "  %-38s", state_name[c->state]);
        }
        fprintf(o, "\n");
    }
    for (int y = 0; y < NSYS; y++)
        for (int si = 0; si < NSHAPES; si++) {
            const cell *c = &b->cells[y][si];
            if (c->state == CELL_SKIP || c->state == CELL_FAIL)
                fprintf(o, "  %s %s %s: %s\n", names[y], shapes[si].name, state_name[c->state],
                        c->why);
        }
    fprintf(o, "%-28s", "targets (ratio)");
    for (int si = 0; si < NSHAPES; si++)
        fprintf(o, "    %-30s", shapes[si].title);
    fprintf(o, "\n");
    for (int t = 0; t < NTARGETS; t++) {
        fprintf(o, "  %-17s %s %-4g", targets[t].name, targets[t].strict ? "> " : ">=",
                targets[t].min);
        for (int si = 0; si < NSHAPES; si++)
            for (int g = 0; g < 2; g++) {
                double r = ratio(b, &targets[t], si, g);
                char v[16];
                snprintf(v, sizeof v, r < 0 ? "-" : "%.2f", r);
                fprintf(o, "%s%s %5s %-4s", g ? "  " : "    ", g ? "get" : "put", v,
                        met(&targets[t], r));
            }
        fprintf(o, "\n");
    }
}

static void print_json(const sb *b, const char *master, int spawned)
{
    char m[300], w[400];
    kvp_bench_json_escape(m, sizeof m, master);
    printf("{\n  \"bench\": \"store\",\n  \"master\": \"%s\",\n  \"spawned_serve\": %s,\n"
           "  \"segment_size\": \"%s\",\n  \"rounds\": %d,\n  \"connections\": %d,\n"
           "  \"contend\": %d,\n"
           "  \"transports\": {\"kvpool_shm\": \"%s\", \"kvpool_tcp\": \"%s\"},\n  \"shapes\": [",
           m, spawned ? "true" : "false", spawned ? SEGMENT_SIZE : "", b->rounds, BENCH_CONNS,
           b->contend, b->transport[0], b->transport[1]);
    for (int si = 0; si < NSHAPES; si++)
        printf("%s{\"shape\": \"%s\", \"values\": %u, \"value_bytes\": %zu, \"batch_bytes\": %zu}",
               si ? ", " : "", shapes[si].name, shapes[si].n, shapes[si].size,
               (size_t)shapes[si].n * shapes[si].size);
    printf("],\n  \"results\": [\n");
    int first = 1;
    for (int y = 0; y < NSYS; y++)
        for (int si = 0; si < NSHAPES; si++) {
            const cell *c = &b->cells[y][si];
            printf("%s    {\"system\": \"%s\", \"shape\": \"%s\", \"status\": \"%s\"",
                   first ? "" : ",\n", sys_id[y], shapes[si].name,
                   c->state == CELL_SKIP ? "skipped" : state_name[c->state]);
            first = 0;
            if (c->state == CELL_OK)
                printf(", \"rounds\": %d, \"put_gbps\": %.3f, \"get_gbps\": %.3f, "
                       "\"put_p50_us\": %.1f, \"get_p50_us\": %.1f",
                       c->rounds, c->put_gbps, c->get_gbps, c->put_p50_us, c->get_p50_us);
            else if (c->why[0]) {
                kvp_bench_json_escape(w, sizeof w, c->why);
                printf(", \"reason\": \"%s\"", w);
            }
            printf("}");
        }
    printf("\n  ],\n  \"ratios\": [\n");
    first = 1;
    for (int t = 0; t < NTARGETS; t++)
        for (int si = 0; si < NSHAPES; si++)
            for (int g = 0; g < 2; g++) {
                double r = ratio(b, &targets[t], si, g);
                const char *mt = met(&targets[t], r);
                printf("%s    {\"ratio\": \"%s\", \"shape\": \"%s\", \"op\": \"%s\", ",
                       first ? "" : ",\n", targets[t].name, shapes[si].name, g ? "get" : "put");
                first = 0;
                if (r < 0)
                    printf("\"value\": null, ");
                else
                    printf("\"value\": %.3f, ", r);
                printf("\"target\": \"%s %g\", \"met\": %s}", targets[t].strict ? ">" : ">=",
                       targets[t].min, r < 0 ? "null" : strcmp(mt, "met") ? "false" : "true");
            }
    printf("\n  ]\n}\n");
}

/* ------------------------------------------------------------ command */

int kvp_bench_store(int argc, char **argv)
{
    kvp_config cfg;
    kvp_config_defaults(&cfg);
    static const kvp_cli_flag own[] = {{"json", KVP_CLI_BOOL}, {"master", KVP_CLI_CONNECT},
                                       {"rounds", KVP_CLI_TEXT}, {"contend", KVP_CLI_TEXT},
                                       {NULL, KVP_CLI_TEXT}};
    const char *v[4] = {NULL};
    int rc = kvp_cli_parse(argc, argv, &cfg, own, v, NULL);
    if (rc == 1) {
        printf("usage: kvpool bench store [--json] [--master HOST:PORT] [--rounds N]\n"
               "                          [--contend N]\n"
               "  batch put/get of 64 x 512 KiB and 16 x 2 MiB values through kvpool (shm and\n"
               "  tcp), next to memcpy, a raw %d-connection loopback TCP stream, redis-server\n"
               "  and memcached (started on free loopback ports), in one run\n"
               "  --json          JSON on stdout, the table on stderr\n"
               "  --master ADDR   use this master (default: start `kvpool serve`, segment %s)\n"
               "  --rounds N      timed batches per cell, 1..1000 (default 20; a cell stops\n"
               "                  after 3 rounds once it has run 2 s)\n"
               "  --contend N     N busy processes hold cores for the whole run, 0..64\n"
               "                  (default 0)\n",
               BENCH_CONNS, SEGMENT_SIZE);
        return 0;
    }
    if (rc < 0)
        return 2;
    uint64_t rounds64 = 20;
    if (v[2] && kvp_cli_uint("bench store", "rounds", v[2], 1, 1000, &rounds64) != 0)
        return 2;
    int rounds = (int)rounds64;
    uint64_t contend = 0;
    if (v[3] && kvp_cli_uint("bench store", "contend", v[3], 0, 64, &contend) != 0)
        return 2;
    signal(SIGPIPE, SIG_IGN);
    sb *b = kvp_calloc(1, sizeof *b);
    if (!b) {
        fprintf(stderr, "kvpool bench store: out of memory\n");
        return 1;
    }
    int json = v[0] != NULL, ret = 1;
    b->out = json ? stderr : stdout;
    b->rounds = rounds;
    b->contend = (int)contend;
    b->nonce = ((unsigned long long)getpid() << 32) ^ kvp_now_ns();
    snprintf(b->transport[0], 16, "-");
    snprintf(b->transport[1], 16, "-");
    b->src = kvp_malloc(BATCH_BYTES);
    b->dst = kvp_malloc(BATCH_BYTES);
    b->put_ns = kvp_malloc((size_t)(rounds < 5 ? 5 : rounds) * sizeof *b->put_ns);
    b->get_ns = kvp_malloc((size_t)(rounds < 5 ? 5 : rounds) * sizeof *b->get_ns);
    pid_t pid = 0;
    char addr[300];
    if (!b->src || !b->dst || !b->put_ns || !b->get_ns) {
        fprintf(stderr, "kvpool bench store: out of memory\n");
        goto out;
    }
    /* every byte of both buffers is written here, before any timing; the
     * source is a xorshift stream so that a misplaced piece is caught */
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < BATCH_BYTES; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(b->src + i, &x, 8);
    }
    memset(b->dst, 0, BATCH_BYTES);
    if (spin_start(b) != 0)
        goto out;

    for (int si = 0; si < NSHAPES; si++)
        bench_memcpy(b, &shapes[si], &b->cells[SYS_MEMCPY][si]);

    raw r;
    memset(&r, 0, sizeof r);
    char why[192];
    if (raw_open(&r, why, sizeof why) == 0) {
        for (int si = 0; si < NSHAPES; si++)
            run_cell(b, "raw TCP", raw_batch, NULL, &r, &shapes[si], &b->cells[SYS_RAW][si]);
        raw_close(&r);
    } else {
        for (int si = 0; si < NSHAPES; si++)
            fail(&b->cells[SYS_RAW][si], "%s", why);
    }

    if (v[1]) {
        snprintf(addr, sizeof addr, "%s", v[1]);
        bench_kvpool(b, addr, cfg.cluster_token);
    } else if ((pid = spawn_serve(addr, sizeof addr)) > 0) {
        bench_kvpool(b, addr, cfg.cluster_token);
    } else {
        pid = 0;
        snprintf(addr, sizeof addr, "-");
        for (int t = SYS_SHM; t <= SYS_TCP; t++)
            for (int si = 0; si < NSHAPES; si++)
                fail(&b->cells[t][si], "%s", "could not start `kvpool serve`");
    }

    if (v[1] || pid > 0) {
        char uwhy[160] = "";
        if (kvp_ucx_load(uwhy, sizeof uwhy) == 0)
            bench_ucx(b, addr, cfg.cluster_token);
        for (int i = 0; i < 2; i++)
            for (int si = 0; si < NSHAPES; si++)
                if (b->cells[SYS_UCX_TCP + i][si].state == CELL_NONE)
                    skip(&b->cells[SYS_UCX_TCP + i][si], "%s", uwhy);
    }
    bench_perftest(b);

    bench_peer(b, PEER_REDIS, SYS_REDIS);
    bench_peer(b, PEER_MEMCACHED, SYS_MEMCACHED);

    print_table(b, addr, pid > 0);
    if (json)
        print_json(b, addr, pid > 0);
    ret = 0;
    for (int y = SYS_MEMCPY; y <= SYS_TCP; y++)
        for (int si = 0; si < NSHAPES; si++)
            if (b->cells[y][si].state != CELL_OK)
                ret = 1;
out:
    if (pid > 0) {
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
    }
    spin_stop(b);
    kvp_free(b->src);
    kvp_free(b->dst);
    kvp_free(b->put_ns);
    kvp_free(b->get_ns);
    kvp_free(b);
    return ret;
}
