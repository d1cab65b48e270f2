/*
 * bench_gpu.c -- `kvpool bench gpu`: batch put/get GB/s between CUDA
 * device memory and the pool, next to the physical limit of the same host
 * measured in the same run.
 *
 * Shapes (vLLM's batches):
 *   64x64x32KiB  64 keys, each gathered from / scattered into 64 pieces of
 *                32 KiB at distinct random 32 KiB-aligned offsets of a device
 *                region (--region, default 16 GiB): one layer's K or V of one
 *                block per piece, block tables in random order (128 MiB)
 *   16x2MiB      16 keys of 2 MiB, each one contiguous piece at a random
 *                2 MiB-aligned offset of the region (32 MiB)
 * The put pieces and the get pieces are disjoint (a load lands in other
 * blocks than the store read), every piece inside the one region, which
 * is allocated with kvp_gpu_dev_alloc and registered once with each client
 * (kvp_client_register_buffer: the pointer kind is found per region).
 *
 * Rows:
 *   limit        one synchronous kvp_gpu_memcpy of the batch's byte count
 *                between device memory and page-locked host memory
 *                (kvp_gpu_host_alloc), device->host (the limit of a put) and
 *                host->device (of a get), best of 5: the PCIe link
 *   kvpool shm   kvp_client_batch_put_from_multi_buffers and
 *                kvp_client_batch_get_into_multi_buffers with the device
 *                pieces as kvp_iov bases, a client on the node's host (the
 *                segment mapped from the node's memfd: the GPU copies between
 *                device memory and the segment)
 *   kvpool tcp   the same with KVPOOL_FORCE_TCP=1 at kvp_client_open (the
 *                client's page-locked staging ring and loopback TCP)
 * once per copy strategy (--copy, default batch,kernel,each): each strategy
 * runs in a child process of its own (this binary again, with
 * KVPOOL_GPU_COPY set, which the core reads once), so rows compare the
 * strategies on the same pool; a strategy the core cannot use (it reports
 * another in kvp_gpu_copy_mode) is reported as skipped.
 *
 * Per cell: the source pieces are written with a fresh xorshift pattern and
 * the destination pieces with zeros (host->device copies, untimed), then one
 * warm-up batch whose gets are read back (kvp_gpu_memcpy device->host) and
 * compared with what was put, then --rounds timed batches (default 20; a
 * cell stops early once it has 3 rounds and CELL_NS of batch time): a batch
 * of fresh keys is put, then got back; the keys are removed between rounds
 * (untimed). GB/s = batch bytes x rounds / summed batch time (10^9 B/s); p50
 * is the median batch; ratio = kvpool GB/s / limit GB/s of the same
 * direction (put: device->host, get: host->device); CPU s/GB = user + system
 * time of the client process (getrusage RUSAGE_SELF, every thread) over the
 * timed batches / GB moved (the node's CPU, for TCP, is not in it).
 * Checksums are on (they always are). Target: kvpool shm >= 0.8 x limit,
 * put and get, both shapes.
 *
 * It starts `kvpool serve` (master + storage node, --segment, default
 * 8 GiB) unless --master names a running master. Without a usable device
 * backend (kvp_gpu_status(): no driver, KVPOOL_GPU_BACKEND=off) it prints
 * "skipped: <reason>" and exits 0. KVPOOL_GPU_BACKEND=fake runs everything
 * on the test backend (small --region / --segment for CI). On a real GPU
 * (status "cuda") the JSON is also written to --results (default
 * bench/results/gpu.json, when that directory exists). Exit status 1 when a
 * limit or kvpool cell of a strategy that ran failed.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "cli/cli.h"
#include "client/gpu.h"
#include "common/clock.h"
#include "common/mem.h"
#include "common/size.h"
#include "kvpool.h"

#define KEYCAP 96
#define MAX_KEYS 64
#define MAX_PIECES 4096                  /* pieces of one batch, all keys */
#define CELL_NS 2000000000ull            /* per-cell time bound, after 3 rounds */
#define LIMIT_TRIES 5
#define MIN_REGION ((uint64_t)256 << 20) /* 2 x 4096 pieces of 32 KiB */
#define DEFAULT_REGION "16GiB"
#define DEFAULT_SEGMENT "8GiB"
#define DEFAULT_COPY "batch,kernel,each"
#define DEFAULT_RESULTS "bench/results/gpu.json"
#define MAX_RUNS 8

typedef struct shape {
    const char *name, *title;
    uint32_t keys, pieces; /* pieces per key */
    size_t piece;          /* bytes per piece, also its alignment in the region */
} shape;

static const shape shapes[] = {
    {"64x64x32KiB", "64 keys x 64 x 32 KiB", 64, 64, (size_t)32 << 10},
    {"16x2MiB", "16 keys x 2 MiB", 16, 1, (size_t)2 << 20},
};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))

static size_t batch_bytes(const shape *s) { return (size_t)s->keys * s->pieces * s->piece; }
static size_t max_batch(void)
{
    size_t m = 0;
    for (int i = 0; i < NSHAPES; i++)
        if (batch_bytes(&shapes[i]) > m)
            m = batch_bytes(&shapes[i]);
    return m;
}
static size_t max_piece(void)
{
    size_t m = 0;
    for (int i = 0; i < NSHAPES; i++)
        if (shapes[i].piece > m)
            m = shapes[i].piece;
    return m;
}

enum { T_SHM, T_TCP, NT };
static const char *const tr_id[NT] = {"shm", "tcp"};

enum { CELL_NONE, CELL_OK, CELL_SKIP, CELL_FAIL };
static const char *const state_name[] = {"not run", "ok", "skipped", "failed"};

/* What a child reports to its parent (plain data: the same binary on both
 * sides of the pipe). */
typedef struct gcell {
    int state, rounds;
    double put_gbps, get_gbps, put_p50_us, get_p50_us;
    double put_cpu, get_cpu; /* CPU seconds per GB moved */
    int fake;                 /* the fake backend's counters below are valid */
    uint64_t fake_copies, fake_pageable; /* over the cell: pieces copied, of them pageable */
    char why[200];
} gcell;

typedef struct glimit {
    int state;
    double d2h_gbps, h2d_gbps;
    char why[200];
} glimit;

typedef struct grun {
    uint32_t magic;
    int state;          /* CELL_OK: it ran (cells say how); SKIP / FAIL: why */
    char asked[16];     /* KVPOOL_GPU_COPY given */
    char mode[16];      /* kvp_gpu_copy_mode() in the child */
    char transport[NT][16];
    glimit lim[NSHAPES];
    gcell cells[NT][NSHAPES];
    char why[240];
} grun;
#define GRUN_MAGIC 0x6B765047u

/* ------------------------------------------------------------ helpers */

static uint64_t cpu_ns(void)
{
    struct rusage u;
    if (getrusage(RUSAGE_SELF, &u) != 0)
        return 0;
    return ((uint64_t)u.ru_utime.tv_sec + (uint64_t)u.ru_stime.tv_sec) * 1000000000ull +
           ((uint64_t)u.ru_utime.tv_usec + (uint64_t)u.ru_stime.tv_usec) * 1000ull;
}

static uint64_t xs(uint64_t *x)
{
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
    return *x;
}

/* The CUDA driver is used once this process has loaded it (gpu.h): a
 * program without torch loads it itself. The fake and off backends need
 * nothing; a failure is what kvp_gpu_status() then reports. */
static char dl_error[200];
static void load_driver(void)
{
    const char *b = getenv("KVPOOL_GPU_BACKEND");
    if (b && (!strcmp(b, "fake") || !strcmp(b, "off")))
        return;
    if (!dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL)) {
        const char *e = dlerror();
        snprintf(dl_error, sizeof dl_error, "%.190s", e ? e : "dlopen failed");
    }
}

/* ------------------------------------------------------------ child */

typedef struct gk {
    uint8_t *region;
    size_t region_len;
    uint8_t *hexp, *hrd, *hzero; /* page-locked: max_batch, max_batch, max_piece */
    int rounds;
    unsigned long long nonce, seq, cellno;
    char keybuf[MAX_KEYS][KEYCAP];
    const char *keys[MAX_KEYS];
    size_t *off[NSHAPES][2];     /* per shape, put (0) and get (1) piece offsets */
    kvp_iov *iov[NSHAPES][2];
    const kvp_iov *iovs[NSHAPES][2][MAX_KEYS];
    size_t niov[NSHAPES][MAX_KEYS];
    uint64_t *put_ns, *get_ns, *put_cpu, *get_cpu;
} gk;

static void make_keys(gk *k, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        snprintf(k->keybuf[i], KEYCAP, "kvpool-bench/gpu-%016llx@tp0@pcp0@dcp0@pp0@%020llu",
                 k->nonce, k->seq++);
        k->keys[i] = k->keybuf[i];
    }
}

/* Distinct random piece offsets: a partial Fisher-Yates over the region's
 * slots of the shape's alignment; the first keys x pieces are the put
 * pieces, the next as many the get pieces. */
static int pick_offsets(gk *k, int si, char *why, size_t wl)
{
    const shape *s = &shapes[si];
    size_t nslots = k->region_len / s->piece, need = (size_t)s->keys * s->pieces;
    if (nslots < 2 * need) {
        snprintf(why, wl, "region of %zu bytes holds %zu pieces of %zu, %zu needed",
                 k->region_len, nslots, s->piece, 2 * need);
        return -1;
    }
    uint32_t *slot = kvp_malloc(nslots * sizeof *slot);
    if (!slot) {
        snprintf(why, wl, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < nslots; i++)
        slot[i] = (uint32_t)i;
    uint64_t x = 0x2545F4914F6CDD1Dull ^ (uint64_t)(si + 1) * 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < 2 * need; i++) {
        size_t j = i + (size_t)(xs(&x) % (nslots - i));
        uint32_t t = slot[i];
        slot[i] = slot[j], slot[j] = t;
    }
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < need; i++) {
            k->off[si][d][i] = (size_t)slot[d * need + i] * s->piece;
            k->iov[si][d][i].base = k->region + k->off[si][d][i];
            k->iov[si][d][i].len = s->piece;
        }
    for (int d = 0; d < 2; d++)
        for (uint32_t i = 0; i < s->keys; i++)
            k->iovs[si][d][i] = &k->iov[si][d][(size_t)i * s->pieces];
    for (uint32_t i = 0; i < s->keys; i++)
        k->niov[si][i] = s->pieces;
    kvp_free(slot);
    return 0;
}

/* Fresh pattern into hexp (key i's value = hexp[i * value bytes ...]); the
 * put pieces get it, the get pieces zeros. */
static int prepare(gk *k, int si, char *why, size_t wl)
{
    const shape *s = &shapes[si];
    size_t n = (size_t)s->keys * s->pieces, bytes = batch_bytes(s);
    uint64_t x = 0x9E3779B97F4A7C15ull ^ (k->nonce + ++k->cellno * 0xD1B54A32D192ED03ull);
    for (size_t i = 0; i < bytes; i += 8) {
        uint64_t v = xs(&x);
        memcpy(k->hexp + i, &v, 8);
    }
    for (size_t i = 0; i < n; i++) {
        int rc = kvp_gpu_memcpy(k->iov[si][0][i].base, k->hexp + i * s->piece, s->piece);
        if (rc == 0)
            rc = kvp_gpu_memcpy(k->iov[si][1][i].base, k->hzero, s->piece);
        if (rc) {
            snprintf(why, wl, "filling device memory: kvp_gpu_memcpy: %s (%s)", kvp_strerror(rc),
                     kvp_gpu_status());
            return -1;
        }
    }
    return 0;
}

/* The get pieces, read back to the host, against what was put. */
static int verify(gk *k, int si, char *why, size_t wl)
{
    const shape *s = &shapes[si];
    size_t n = (size_t)s->keys * s->pieces;
    for (size_t i = 0; i < n; i++) {
        int rc = kvp_gpu_memcpy(k->hrd + i * s->piece, k->iov[si][1][i].base, s->piece);
        if (rc) {
            snprintf(why, wl, "reading back: kvp_gpu_memcpy: %s (%s)", kvp_strerror(rc),
                     kvp_gpu_status());
            return -1;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (memcmp(k->hrd + i * s->piece, k->hexp + i * s->piece, s->piece) != 0) {
            snprintf(why, wl, "key %zu piece %zu read back into device memory differs from what "
                     "was put", i / s->pieces, i % s->pieces);
            return -1;
        }
    return 0;
}

static int kv_batch(gk *k, kvp_client *c, int si, int is_put, char *why, size_t wl)
{
    const shape *s = &shapes[si];
    int64_t res[MAX_KEYS];
    size_t vlen = (size_t)s->pieces * s->piece;
    int rc = is_put ? kvp_client_batch_put_from_multi_buffers(c, k->keys, k->iovs[si][0],
                                                              k->niov[si], s->keys, res)
                    : kvp_client_batch_get_into_multi_buffers(c, k->keys, k->iovs[si][1],
                                                              k->niov[si], s->keys, res);
    if (rc < 0) {
        snprintf(why, wl, "%s", kvp_strerror(rc));
        return -1;
    }
    for (uint32_t i = 0; i < s->keys; i++)
        if (res[i] != (int64_t)vlen) {
            if (res[i] < 0)
                snprintf(why, wl, "key %u: %s", i, kvp_strerror((int)res[i]));
            else
                snprintf(why, wl, "key %u: %lld of %zu bytes moved", i, (long long)res[i], vlen);
            return -1;
        }
    return 0;
}

static int kv_clean(gk *k, kvp_client *c, uint32_t n, char *why, size_t wl)
{
    for (uint32_t i = 0; i < n; i++) {
        int rc = kvp_client_remove(c, k->keys[i], 1);
        if (rc && rc != KVP_EOBJECT_NOT_FOUND) {
            snprintf(why, wl, "remove: %s", kvp_strerror(rc));
            return -1;
        }
    }
    return 0;
}

static void cell_fail(gcell *c, const char *what, const char *why)
{
    c->state = CELL_FAIL;
    snprintf(c->why, sizeof c->why, "%s%.180s", what, why);
}

static void run_cell(gk *k, kvp_client *c, const char *label, int si, gcell *out)
{
    const shape *s = &shapes[si];
    char why[200];
    int done = 0;
    uint64_t spent = 0;
    if (prepare(k, si, why, sizeof why)) {
        cell_fail(out, "", why);
        return;
    }
    kvp_gpu_fake_stats f0 = {0}, f1 = {0};
    int fake = !strcmp(kvp_gpu_copy_mode(), "fake");
    for (int r = -1; r < k->rounds; r++) {
        kvp_bench_progress(label, 16, s->name, 12, r, k->rounds);
        make_keys(k, s->keys);
        if (fake && r == 0) /* the timed rounds' copies (not the warm-up's read-back) */
            kvp_gpu_fake_get_stats(&f0);
        uint64_t c0 = cpu_ns(), t0 = kvp_now_ns();
        if (kv_batch(k, c, si, 1, why, sizeof why)) {
            kvp_bench_progress_clear(70);
            cell_fail(out, "put: ", why);
            return;
        }
        uint64_t t1 = kvp_now_ns(), c1 = cpu_ns();
        if (kv_batch(k, c, si, 0, why, sizeof why)) {
            kvp_bench_progress_clear(70);
            cell_fail(out, "get: ", why);
            return;
        }
        uint64_t t2 = kvp_now_ns(), c2 = cpu_ns();
        if (r < 0 && verify(k, si, why, sizeof why)) {
            kvp_bench_progress_clear(70);
            cell_fail(out, "warm-up: ", why);
            return;
        }
        if (r >= 0) {
            k->put_ns[done] = t1 - t0;
            k->get_ns[done] = t2 - t1;
            k->put_cpu[done] = c1 - c0;
            k->get_cpu[done] = c2 - c1;
            spent += t2 - t0;
            done++;
        }
        if (kv_clean(k, c, s->keys, why, sizeof why)) {
            kvp_bench_progress_clear(70);
            cell_fail(out, "between rounds: ", why);
            return;
        }
        if (done >= 3 && spent > CELL_NS)
            break;
    }
    kvp_bench_progress_clear(70);
    if (fake) {
        kvp_gpu_fake_get_stats(&f1);
        out->fake = 1;
        out->fake_copies = f1.copies - f0.copies;
        out->fake_pageable = f1.pageable - f0.pageable;
    }
    uint64_t put = 0, get = 0, pc = 0, gc = 0;
    for (int i = 0; i < done; i++)
        put += k->put_ns[i], get += k->get_ns[i], pc += k->put_cpu[i], gc += k->get_cpu[i];
    double bytes = (double)batch_bytes(s) * done;
    qsort(k->put_ns, (size_t)done, sizeof *k->put_ns, kvp_bench_cmp_u64);
    qsort(k->get_ns, (size_t)done, sizeof *k->get_ns, kvp_bench_cmp_u64);
    out->state = CELL_OK;
    out->rounds = done;
    out->put_gbps = put ? bytes / (double)put : 0;
    out->get_gbps = get ? bytes / (double)get : 0;
    out->put_p50_us = (double)k->put_ns[done / 2] / 1e3;
    out->get_p50_us = (double)k->get_ns[done / 2] / 1e3;
    out->put_cpu = bytes > 0 ? (double)pc / bytes : 0; /* ns per byte = s per GB */
    out->get_cpu = bytes > 0 ? (double)gc / bytes : 0;
}

/* The physical limit for one shape's byte count: one synchronous copy,
 * device <-> page-locked host, best of LIMIT_TRIES per direction. */
static void measure_limit(gk *k, int si, glimit *l)
{
    size_t bytes = batch_bytes(&shapes[si]);
    uint64_t best[2] = {UINT64_MAX, UINT64_MAX};
    for (int t = 0; t < LIMIT_TRIES; t++)
        for (int d = 0; d < 2; d++) {
            uint64_t t0 = kvp_now_ns();
            int rc = d == KVP_GPU_D2H ? kvp_gpu_memcpy(k->hrd, k->region, bytes)
                                      : kvp_gpu_memcpy(k->region, k->hexp, bytes);
            uint64_t e = kvp_now_ns() - t0;
            if (rc) {
                l->state = CELL_FAIL;
                snprintf(l->why, sizeof l->why, "kvp_gpu_memcpy %s: %s (%s)",
                         d == KVP_GPU_D2H ? "device->host" : "host->device", kvp_strerror(rc),
                         kvp_gpu_status());
                return;
            }
            if (e < best[d])
                best[d] = e;
        }
    l->state = CELL_OK;
    l->d2h_gbps = (double)bytes / (double)(best[KVP_GPU_D2H] ? best[KVP_GPU_D2H] : 1);
    l->h2d_gbps = (double)bytes / (double)(best[KVP_GPU_H2D] ? best[KVP_GPU_H2D] : 1);
}

/* A standalone-store client (TCP-only when force_tcp) with the device
 * region registered; waits until a put succeeds (the node may still be
 * mounting) and records the transport the client uses (kvp_client_describe). */
static kvp_client *kv_open(gk *k, const char *master, const char *token, int force_tcp,
                           char *transport, char *why, size_t wl)
{
    kvp_client *c = kvp_bench_client_open(master, token, force_tcp, why, wl);
    if (!c)
        return NULL;
    int rc = kvp_client_register_buffer(c, k->region, k->region_len);
    if (rc != 0) {
        snprintf(why, wl, "kvp_client_register_buffer(device region of %zu bytes): %s (%.80s)",
                 k->region_len, kvp_strerror(rc), kvp_gpu_status());
        kvp_client_close(c);
        return NULL;
    }
    char probe[KEYCAP];
    snprintf(probe, sizeof probe, "kvpool-bench/gpu-%016llx@probe%d", k->nonce, force_tcp);
    if (kvp_bench_client_probe(c, probe, k->hexp, transport, why, wl) != 0) {
        kvp_client_unregister_buffer(c, k->region);
        kvp_client_close(c);
        return NULL;
    }
    return c;
}

/* One strategy, in this (child) process; the report goes to fd. */
static int bench_child(int fd, const char *asked, const char *master, const char *token,
                       uint64_t region_len, int rounds)
{
    grun *g = kvp_calloc(1, sizeof *g);
    gk *k = kvp_calloc(1, sizeof *k);
    if (!g || !k) {
        kvp_free(g);
        kvp_free(k);
        return 1;
    }
    g->magic = GRUN_MAGIC;
    snprintf(g->asked, sizeof g->asked, "%.15s", asked);
    snprintf(g->transport[0], 16, "-");
    snprintf(g->transport[1], 16, "-");
    load_driver();
    k->rounds = rounds;
    k->nonce = ((unsigned long long)getpid() << 32) ^ kvp_now_ns();
    k->region_len = (size_t)region_len;
    int nr = rounds < 5 ? 5 : rounds;
    k->put_ns = kvp_malloc((size_t)nr * sizeof(uint64_t));
    k->get_ns = kvp_malloc((size_t)nr * sizeof(uint64_t));
    k->put_cpu = kvp_malloc((size_t)nr * sizeof(uint64_t));
    k->get_cpu = kvp_malloc((size_t)nr * sizeof(uint64_t));
    for (int si = 0; si < NSHAPES; si++)
        for (int d = 0; d < 2; d++) {
            size_t n = (size_t)shapes[si].keys * shapes[si].pieces;
            k->off[si][d] = kvp_calloc(n, sizeof(size_t));
            k->iov[si][d] = kvp_calloc(n, sizeof(kvp_iov));
            if (!k->off[si][d] || !k->iov[si][d])
                goto oom;
        }
    if (!k->put_ns || !k->get_ns || !k->put_cpu || !k->get_cpu)
        goto oom;
    if (!kvp_gpu_active()) {
        g->state = CELL_SKIP;
        snprintf(g->why, sizeof g->why, "no device backend: %s", kvp_gpu_status());
        goto report;
    }
    snprintf(g->mode, sizeof g->mode, "%.15s", kvp_gpu_copy_mode());
    if (strcmp(asked, "auto") && strcmp(g->mode, asked) && strcmp(g->mode, "fake")) {
        g->state = CELL_SKIP;
        snprintf(g->why, sizeof g->why, "KVPOOL_GPU_COPY=%s: the core uses \"%s\" (%s is not "
                 "available here)", asked, g->mode, asked);
        goto report;
    }
    k->region = kvp_gpu_dev_alloc(0, k->region_len);
    k->hexp = kvp_gpu_host_alloc(max_batch());
    k->hrd = kvp_gpu_host_alloc(max_batch());
    k->hzero = kvp_gpu_host_alloc(max_piece());
    if (!k->region || !k->hexp || !k->hrd || !k->hzero) {
        g->state = CELL_FAIL;
        snprintf(g->why, sizeof g->why, "%s failed (%s)",
                 !k->region ? "kvp_gpu_dev_alloc of the region" : "kvp_gpu_host_alloc",
                 kvp_gpu_status());
        goto report;
    }
    memset(k->hzero, 0, max_piece());
    memset(k->hrd, 0, max_batch());
    memset(k->hexp, 0x5A, max_batch());
    char why[200];
    for (int si = 0; si < NSHAPES; si++)
        if (pick_offsets(k, si, why, sizeof why)) {
            g->state = CELL_FAIL;
            snprintf(g->why, sizeof g->why, "%s", why);
            goto report;
        }
    for (int si = 0; si < NSHAPES; si++) {
        if (isatty(2))
            fprintf(stderr, "\r  %-16s %-12s limit        ", asked, shapes[si].name);
        measure_limit(k, si, &g->lim[si]);
        kvp_bench_progress_clear(70);
    }
    g->state = CELL_OK;
    for (int t = 0; t < NT; t++) {
        char label[32];
        snprintf(label, sizeof label, "%s %s", asked, tr_id[t]);
        kvp_client *c = kv_open(k, master, token, t == T_TCP, g->transport[t], why, sizeof why);
        for (int si = 0; si < NSHAPES; si++) {
            if (!c)
                cell_fail(&g->cells[t][si], "", why);
            else
                run_cell(k, c, label, si, &g->cells[t][si]);
        }
        if (c) {
            kvp_client_unregister_buffer(c, k->region);
            kvp_client_close(c);
        }
    }
    goto report;
oom:
    g->state = CELL_FAIL;
    snprintf(g->why, sizeof g->why, "out of memory");
report:;
    int rc = kvp_bench_write_all(fd, g, sizeof *g);
    close(fd);
    if (k->region)
        kvp_gpu_dev_free(k->region);
    if (k->hexp)
        kvp_gpu_host_free(k->hexp);
    if (k->hrd)
        kvp_gpu_host_free(k->hrd);
    if (k->hzero)
        kvp_gpu_host_free(k->hzero);
    for (int si = 0; si < NSHAPES; si++)
        for (int d = 0; d < 2; d++) {
            kvp_free(k->off[si][d]);
            kvp_free(k->iov[si][d]);
        }
    kvp_free(k->put_ns);
    kvp_free(k->get_ns);
    kvp_free(k->put_cpu);
    kvp_free(k->get_cpu);
    kvp_free(k);
    kvp_free(g);
    return rc ? 1 : 0;
}

/* ------------------------------------------------------------ parent */

/* Runs this binary again as the child of one strategy: the original flags,
 * then --child FD --master ADDR --copy MODE (later flags win), with
 * KVPOOL_GPU_COPY=MODE; its stdout goes to stderr. Waits up to timeout_s. */
static void run_strategy(int argc, char **argv, const char *mode, const char *master,
                         int timeout_s, grun *g)
{
    memset(g, 0, sizeof *g);
    snprintf(g->asked, sizeof g->asked, "%.15s", mode);
    int p[2];
    if (pipe(p) != 0) {
        g->state = CELL_FAIL;
        snprintf(g->why, sizeof g->why, "pipe: %s", strerror(errno));
        return;
    }
    char fdstr[16];
    snprintf(fdstr, sizeof fdstr, "%d", p[1]);
    const char **av = kvp_calloc((size_t)argc + 12, sizeof *av);
    if (!av) {
        close(p[0]), close(p[1]);
        g->state = CELL_FAIL;
        snprintf(g->why, sizeof g->why, "out of memory");
        return;
    }
    int n = 0;
    av[n++] = "kvpool";
    av[n++] = "bench";
    av[n++] = "gpu";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) /* bench gpu takes no positional arguments */
            break;
        av[n++] = argv[i];
    }
    av[n++] = "--child";
    av[n++] = fdstr;
    av[n++] = "--master";
    av[n++] = master;
    av[n++] = "--copy";
    av[n++] = mode;
    av[n] = NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(p[0]);
        dup2(2, 1);
        setenv("KVPOOL_GPU_COPY", mode, 1);
        execv("/proc/self/exe", (char *const *)av);
        _exit(127);
    }
    kvp_free(av);
    close(p[1]);
    if (pid < 0) {
        close(p[0]);
        g->state = CELL_FAIL;
        snprintf(g->why, sizeof g->why, "fork: %s", strerror(errno));
        return;
    }
    grun got;
    size_t have = 0;
    uint64_t deadline = kvp_now_ms() + (uint64_t)timeout_s * 1000;
    int timed_out = 0;
    for (;;) {
        uint64_t now = kvp_now_ms();
        if (now >= deadline) {
            timed_out = 1;
            break;
        }
        struct pollfd pf = {.fd = p[0], .events = POLLIN};
        int r = poll(&pf, 1, (int)(deadline - now > 1000 ? 1000 : deadline - now));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            continue;
        ssize_t m = read(p[0], (uint8_t *)&got + have, sizeof got - have);
        if (m < 0 && errno == EINTR)
            continue;
        if (m <= 0)
            break;
        have += (size_t)m;
        if (have == sizeof got)
            break;
    }
    close(p[0]);
    if (timed_out)
        kill(pid, SIGKILL);
    int st = 0;
    waitpid(pid, &st, 0);
    if (have == sizeof got && got.magic == GRUN_MAGIC) {
        *g = got;
        return;
    }
    g->state = CELL_FAIL;
    if (timed_out)
        snprintf(g->why, sizeof g->why, "timed out after %d s (--timeout)", timeout_s);
    else if (WIFSIGNALED(st))
        snprintf(g->why, sizeof g->why, "the benchmark process died of signal %d (%s)",
                 WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(g->why, sizeof g->why, "the benchmark process exited with status %d without "
                 "a report", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

typedef struct report {
    const char *status, *master, *segment;
    int spawned, rounds, nruns;
    uint64_t region;
    grun runs[MAX_RUNS];
} report;

static double ratio_of(const grun *g, int t, int si, int get)
{
    const gcell *c = &g->cells[t][si];
    const glimit *l = &g->lim[si];
    if (g->state != CELL_OK || c->state != CELL_OK || l->state != CELL_OK)
        return -1;
    double lim = get ? l->h2d_gbps : l->d2h_gbps;
    return lim > 0 ? (get ? c->get_gbps : c->put_gbps) / lim : -1;
}

/* The strategy with the best ratio for (transport, shape, op), or -1. */
static int best_run(const report *R, int t, int si, int get)
{
    int b = -1;
    double bv = -1;
    for (int i = 0; i < R->nruns; i++) {
        double r = ratio_of(&R->runs[i], t, si, get);
        if (r > bv)
            bv = r, b = i;
    }
    return b;
}

static void print_table(FILE *o, const report *R)
{
    fprintf(o, "kvpool bench gpu: %s, master %s%s%s%s, region %llu MiB, %d rounds\n", R->status,
            R->master, R->spawned ? " (kvpool serve, segment " : "",
            R->spawned ? R->segment : "", R->spawned ? ")" : "",
            (unsigned long long)(R->region >> 20), R->rounds);
    for (int si = 0; si < NSHAPES; si++)
        fprintf(o, "  %-12s %s (%zu MiB per batch)\n", shapes[si].name, shapes[si].title,
                batch_bytes(&shapes[si]) >> 20);
    fprintf(o, "  %-11s %-4s %-12s %9s %7s %6s %8s   %9s %7s %6s %8s\n", "copy", "via", "shape",
            "put GB/s", "limit", "ratio", "CPU s/GB", "get GB/s", "limit", "ratio", "CPU s/GB");
    for (int i = 0; i < R->nruns; i++) {
        const grun *g = &R->runs[i];
        char cp[40];
        snprintf(cp, sizeof cp, "%s%s%s", g->asked, g->mode[0] && strcmp(g->mode, g->asked) ? "=" : "",
                 g->mode[0] && strcmp(g->mode, g->asked) ? g->mode : "");
        if (g->state != CELL_OK) {
            fprintf(o, "  %-11s %s: %s\n", cp, state_name[g->state], g->why);
            continue;
        }
        for (int t = 0; t < NT; t++)
            for (int si = 0; si < NSHAPES; si++) {
                const gcell *c = &g->cells[t][si];
                const glimit *l = &g->lim[si];
                fprintf(o, "  %-11s %-4s %-12s ", cp, tr_id[t], shapes[si].name);
                if (c->state != CELL_OK) {
                    fprintf(o, "%s: %s\n", state_name[c->state], c->why);
                    continue;
                }
                double rp = ratio_of(g, t, si, 0), rg = ratio_of(g, t, si, 1);
                char a[16], b[16], la[16], lb[16];
                snprintf(a, sizeof a, rp < 0 ? "-" : "%.2f", rp);
                snprintf(b, sizeof b, rg < 0 ? "-" : "%.2f", rg);
                snprintf(la, sizeof la, l->state == CELL_OK ? "%.2f" : "-", l->d2h_gbps);
                snprintf(lb, sizeof lb, l->state == CELL_OK ? "%.2f" : "-", l->h2d_gbps);
                fprintf(o, "%9.2f %7s %6s %8.4f   %9.2f %7s %6s %8.4f", c->put_gbps, la, a,
                        c->put_cpu, c->get_gbps, lb, b, c->get_cpu);
                if (c->fake)
                    fprintf(o, "   fake: %llu pieces, %llu pageable",
                            (unsigned long long)c->fake_copies,
                            (unsigned long long)c->fake_pageable);
                fprintf(o, "\n");
            }
        for (int si = 0; si < NSHAPES; si++)
            if (g->lim[si].state == CELL_FAIL)
                fprintf(o, "  %-11s limit %s failed: %s\n", cp, shapes[si].name, g->lim[si].why);
    }
    fprintf(o, "target: kvpool shm >= 0.8 x limit (put: device->host, get: host->device); best "
               "strategy per cell:\n");
    for (int t = 0; t < NT; t++)
        for (int si = 0; si < NSHAPES; si++) {
            fprintf(o, "  %-4s %-12s", tr_id[t], shapes[si].name);
            for (int get = 0; get < 2; get++) {
                int b = best_run(R, t, si, get);
                if (b < 0) {
                    fprintf(o, "  %s -", get ? "get" : "put");
                    continue;
                }
                double r = ratio_of(&R->runs[b], t, si, get);
                fprintf(o, "  %s %-6s %.3f%s", get ? "get" : "put", R->runs[b].asked, r,
                        t == T_SHM ? (r >= 0.8 ? " met " : " MISS") : "");
            }
            fprintf(o, "\n");
        }
}

static void print_json(FILE *o, const report *R)
{
    char st[300], m[300], w[480];
    kvp_bench_json_escape(st, sizeof st, R->status);
    kvp_bench_json_escape(m, sizeof m, R->master);
    fprintf(o, "{\n  \"bench\": \"gpu\",\n  \"gpu_status\": \"%s\",\n  \"master\": \"%s\",\n"
               "  \"spawned_serve\": %s,\n  \"segment_size\": \"%s\",\n  \"region_bytes\": %llu,\n"
               "  \"rounds\": %d,\n  \"checksums\": true,\n  \"shapes\": [",
            st, m, R->spawned ? "true" : "false", R->spawned ? R->segment : "",
            (unsigned long long)R->region, R->rounds);
    for (int si = 0; si < NSHAPES; si++)
        fprintf(o, "%s{\"shape\": \"%s\", \"keys\": %u, \"pieces_per_key\": %u, "
                   "\"piece_bytes\": %zu, \"batch_bytes\": %zu}",
                si ? ", " : "", shapes[si].name, shapes[si].keys, shapes[si].pieces,
                shapes[si].piece, batch_bytes(&shapes[si]));
    fprintf(o, "],\n  \"runs\": [\n");
    for (int i = 0; i < R->nruns; i++) {
        const grun *g = &R->runs[i];
        fprintf(o, "%s    {\"copy\": \"%s\", \"copy_mode\": \"%s\", \"status\": \"%s\"",
                i ? ",\n" : "", g->asked, g->mode, state_name[g->state]);
        if (g->state != CELL_OK) {
            kvp_bench_json_escape(w, sizeof w, g->why);
            fprintf(o, ", \"reason\": \"%s\"}", w);
            continue;
        }
        fprintf(o, ", \"transports\": {\"shm\": \"%s\", \"tcp\": \"%s\"}, \"limits\": [",
                g->transport[0], g->transport[1]);
        for (int si = 0; si < NSHAPES; si++) {
            const glimit *l = &g->lim[si];
            fprintf(o, "%s{\"shape\": \"%s\", \"status\": \"%s\"", si ? ", " : "",
                    shapes[si].name, state_name[l->state]);
            if (l->state == CELL_OK)
                fprintf(o, ", \"d2h_gbps\": %.3f, \"h2d_gbps\": %.3f}", l->d2h_gbps, l->h2d_gbps);
            else {
                kvp_bench_json_escape(w, sizeof w, l->why);
                fprintf(o, ", \"reason\": \"%s\"}", w);
            }
        }
        fprintf(o, "]}");
    }
    fprintf(o, "\n  ],\n  \"results\": [\n");
    int first = 1;
    for (int i = 0; i < R->nruns; i++) {
        const grun *g = &R->runs[i];
        if (g->state != CELL_OK)
            continue;
        for (int t = 0; t < NT; t++)
            for (int si = 0; si < NSHAPES; si++) {
                const gcell *c = &g->cells[t][si];
                fprintf(o, "%s    {\"copy\": \"%s\", \"transport\": \"%s\", \"shape\": \"%s\", "
                           "\"status\": \"%s\"",
                        first ? "" : ",\n", g->asked, tr_id[t], shapes[si].name,
                        state_name[c->state]);
                first = 0;
                if (c->state == CELL_OK) {
                    fprintf(o, ", \"rounds\": %d, \"put_gbps\": %.3f, \"get_gbps\": %.3f, "
                               "\"put_p50_us\": %.1f, \"get_p50_us\": %.1f, "
                               "\"put_cpu_s_per_gb\": %.5f, \"get_cpu_s_per_gb\": %.5f",
                            c->rounds, c->put_gbps, c->get_gbps, c->put_p50_us, c->get_p50_us,
                            c->put_cpu, c->get_cpu);
                    if (c->fake)
                        fprintf(o, ", \"fake_pieces\": %llu, \"fake_pageable_pieces\": %llu",
                                (unsigned long long)c->fake_copies,
                                (unsigned long long)c->fake_pageable);
                    for (int get = 0; get < 2; get++) {
                        double r = ratio_of(g, t, si, get);
                        if (r < 0)
                            fprintf(o, ", \"%s_ratio\": null", get ? "get" : "put");
                        else
                            fprintf(o, ", \"%s_ratio\": %.3f", get ? "get" : "put", r);
                    }
                } else {
                    kvp_bench_json_escape(w, sizeof w, c->why);
                    fprintf(o, ", \"reason\": \"%s\"", w);
                }
                fprintf(o, "}");
            }
    }
    fprintf(o, "\n  ],\n  \"best\": [\n");
    first = 1;
    for (int t = 0; t < NT; t++)
        for (int si = 0; si < NSHAPES; si++)
            for (int get = 0; get < 2; get++) {
                int b = best_run(R, t, si, get);
                fprintf(o, "%s    {\"transport\": \"%s\", \"shape\": \"%s\", \"op\": \"%s\", ",
                        first ? "" : ",\n", tr_id[t], shapes[si].name, get ? "get" : "put");
                first = 0;
                if (b < 0) {
                    fprintf(o, "\"copy\": null, \"ratio\": null, \"target\": %s, \"met\": null}",
                            t == T_SHM ? "\">= 0.8\"" : "null");
                    continue;
                }
                const grun *g = &R->runs[b];
                double r = ratio_of(g, t, si, get);
                const gcell *c = &g->cells[t][si];
                fprintf(o, "\"copy\": \"%s\", \"gbps\": %.3f, \"ratio\": %.3f, \"target\": %s, "
                           "\"met\": %s}",
                        g->asked, get ? c->get_gbps : c->put_gbps, r,
                        t == T_SHM ? "\">= 0.8\"" : "null",
                        t != T_SHM ? "null" : r >= 0.8 ? "true" : "false");
            }
    fprintf(o, "\n  ]\n}\n");
}

/* Splits a comma list of strategies into modes[]; 0, or -1 after a message. */
static int parse_copy(const char *v, char modes[][16], int *n)
{
    static const char *const known[] = {"auto", "batch", "kernel", "each"};
    char q[96];
    *n = 0;
    const char *p = v;
    while (*p) {
        size_t l = strcspn(p, ",");
        int ok = 0;
        for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
            if (l == strlen(known[i]) && !strncmp(p, known[i], l))
                ok = 1;
        if (!ok || *n >= MAX_RUNS) {
            fprintf(stderr, "kvpool bench gpu: flag --copy: value %s %s (allowed: a comma list "
                    "of auto, batch, kernel, each; at most %d)\n", kvp_cli_quote(v, q, sizeof q),
                    ok ? "names too many strategies" : "names an unknown strategy", MAX_RUNS);
            return -1;
        }
        snprintf(modes[(*n)++], 16, "%.*s", (int)l, p);
        p += l;
        if (*p == ',')
            p++;
    }
    if (*n == 0) {
        fprintf(stderr, "kvpool bench gpu: flag --copy: value %s names no strategy\n",
                kvp_cli_quote(v, q, sizeof q));
        return -1;
    }
    return 0;
}

static int write_results(const char *path, const report *R, FILE *msg)
{
    char tmp[1100], dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        struct stat sb;
        if (stat(dir[0] ? dir : "/", &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            fprintf(msg, "results: not written (no directory %s)\n", dir);
            return 0;
        }
    }
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(msg, "results: cannot write %s: %s\n", tmp, strerror(errno));
        return -1;
    }
    print_json(f, R);
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        fprintf(msg, "results: cannot write %s: %s\n", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    fprintf(msg, "results: %s\n", path);
    return 0;
}

int kvp_bench_gpu(int argc, char **argv)
{
    kvp_config cfg;
    kvp_config_defaults(&cfg);
    static const kvp_cli_flag own[] = {
        {"json", KVP_CLI_BOOL},    {"master", KVP_CLI_CONNECT}, {"rounds", KVP_CLI_TEXT},
        {"region", KVP_CLI_TEXT},  {"segment", KVP_CLI_TEXT},   {"copy", KVP_CLI_TEXT},
        {"results", KVP_CLI_TEXT}, {"timeout", KVP_CLI_TEXT},   {"child", KVP_CLI_TEXT},
        {NULL, KVP_CLI_TEXT}};
    enum { F_JSON, F_MASTER, F_ROUNDS, F_REGION, F_SEGMENT, F_COPY, F_RESULTS, F_TIMEOUT, F_CHILD };
    const char *v[9] = {NULL};
    /* the flags as given, for the children (the parser reorders argv) */
    char **orig = kvp_calloc((size_t)argc + 1, sizeof *orig);
    if (!orig) {
        fprintf(stderr, "kvpool bench gpu: out of memory\n");
        return 1;
    }
    memcpy(orig, argv, (size_t)argc * sizeof *orig);
    int rc = kvp_cli_parse(argc, argv, &cfg, own, v, NULL);
    if (rc == 1) {
        printf("usage: kvpool bench gpu [--json] [--master HOST:PORT] [--rounds N] [--region SIZE]\n"
               "                        [--segment SIZE] [--copy LIST] [--results FILE]\n"
               "                        [--timeout SECONDS]\n"
               "  batch put/get between CUDA device memory and the pool (64 keys x 64 pieces of\n"
               "  32 KiB scattered over the region, 16 keys x 2 MiB), over shm and tcp, next\n"
               "  to one large device<->page-locked host copy (the PCIe limit); GB/s, ratio to\n"
               "  the limit, client CPU s/GB. Needs the CUDA driver (or KVPOOL_GPU_BACKEND=fake);\n"
               "  without one it prints \"skipped: <reason>\" and exits 0.\n"
               "  --json          JSON on stdout, the table on stderr\n"
               "  --master ADDR   use this master (default: start `kvpool serve`)\n"
               "  --rounds N      timed batches per cell, 1..1000 (default 20; a cell stops\n"
               "                  after 3 rounds once it has run 2 s)\n"
               "  --region SIZE   device memory the pieces are scattered over (default %s,\n"
               "                  at least 256MiB)\n"
               "  --segment SIZE  the started serve's segment (default %s)\n"
               "  --copy LIST     copy strategies, each in its own process with\n"
               "                  KVPOOL_GPU_COPY set: auto, batch, kernel, each (default\n"
               "                  %s; auto with the fake backend)\n"
               "  --results FILE  on a real GPU, the JSON is also written here (default\n"
               "                  %s, if the directory exists)\n"
               "  --timeout S     seconds one strategy may take, 10..3600 (default 180)\n",
               DEFAULT_REGION, DEFAULT_SEGMENT, DEFAULT_COPY, DEFAULT_RESULTS);
        kvp_free(orig);
        return 0;
    }
    uint64_t rounds = 20, region = 0, segment = 0, timeout = 180, childfd = 0;
    if (rc < 0 ||
        (v[F_ROUNDS] && kvp_cli_uint("bench gpu", "rounds", v[F_ROUNDS], 1, 1000, &rounds)) ||
        kvp_cli_size("bench gpu", "region", v[F_REGION] ? v[F_REGION] : DEFAULT_REGION,
                     MIN_REGION, (uint64_t)1 << 44, &region) ||
        kvp_cli_size("bench gpu", "segment", v[F_SEGMENT] ? v[F_SEGMENT] : DEFAULT_SEGMENT,
                     (uint64_t)256 << 20, (uint64_t)1 << 44, &segment) ||
        (v[F_TIMEOUT] && kvp_cli_uint("bench gpu", "timeout", v[F_TIMEOUT], 10, 3600, &timeout)) ||
        (v[F_CHILD] && kvp_cli_uint("bench gpu", "child", v[F_CHILD], 3, 1 << 20, &childfd))) {
        kvp_free(orig);
        return 2;
    }
    region &= ~(((uint64_t)2 << 20) - 1); /* whole 2 MiB slots */
    signal(SIGPIPE, SIG_IGN);
    if (v[F_CHILD]) {
        kvp_free(orig);
        if (!v[F_MASTER] || !v[F_COPY]) {
            fprintf(stderr, "kvpool bench gpu: --child needs --master and --copy\n");
            return 2;
        }
        return bench_child((int)childfd, v[F_COPY], v[F_MASTER], cfg.cluster_token, region,
                           (int)rounds);
    }
    char modes[MAX_RUNS][16];
    int nmodes = 0;
    if (v[F_COPY] && parse_copy(v[F_COPY], modes, &nmodes)) { /* a bad flag first */
        kvp_free(orig);
        return 2;
    }
    load_driver();
    const char *status = kvp_gpu_status();
    int json = v[F_JSON] != NULL;
    FILE *out = json ? stderr : stdout;
    if (!kvp_gpu_active()) {
        char s[300];
        kvp_bench_json_escape(s, sizeof s, status);
        char d[240] = "";
        if (dl_error[0])
            snprintf(d, sizeof d, " (dlopen: %.200s)", dl_error);
        fprintf(out, "kvpool bench gpu: skipped: no usable device backend: %s%s\n", status, d);
        if (json) {
            char de[300];
            kvp_bench_json_escape(de, sizeof de, d);
            printf("{\n  \"bench\": \"gpu\",\n  \"skipped\": \"no usable device backend: %s%s\",\n"
                   "  \"gpu_status\": \"%s\"\n}\n", s, de, s);
        }
        kvp_free(orig);
        return 0;
    }
    int fake = !strncmp(status, "fake", 4);
    if (!v[F_COPY] && parse_copy(fake ? "auto" : DEFAULT_COPY, modes, &nmodes)) {
        kvp_free(orig);
        return 2;
    }
    report *R = kvp_calloc(1, sizeof *R);
    if (!R) {
        kvp_free(orig);
        fprintf(stderr, "kvpool bench gpu: out of memory\n");
        return 1;
    }
    char addr[300], segtxt[32];
    snprintf(segtxt, sizeof segtxt, "%s", v[F_SEGMENT] ? v[F_SEGMENT] : DEFAULT_SEGMENT);
    pid_t pid = 0;
    int ret = 1;
    if (v[F_MASTER]) {
        snprintf(addr, sizeof addr, "%s", v[F_MASTER]);
    } else {
        const char *args[] = {"serve", "--segment-size", segtxt, "--log-level", "warn", NULL};
        if ((pid = kvp_cli_spawn_self(args, 120000, addr, sizeof addr)) <= 0) {
            fprintf(stderr, "kvpool bench gpu: could not start `kvpool serve --segment-size %s`\n",
                    segtxt);
            pid = 0;
            goto out;
        }
    }
    R->status = status;
    R->master = addr;
    R->segment = segtxt;
    R->spawned = pid > 0;
    R->rounds = (int)rounds;
    R->region = region;
    fprintf(out, "kvpool bench gpu: %s; strategies:", status);
    for (int i = 0; i < nmodes; i++)
        fprintf(out, " %s", modes[i]);
    fprintf(out, "\n");
    fflush(out);
    for (int i = 0; i < nmodes; i++) {
        grun *g = &R->runs[R->nruns++];
        run_strategy(argc, orig, modes[i], addr, (int)timeout, g);
        fprintf(out, "  %s: %s%s%s\n", modes[i], state_name[g->state], g->why[0] ? ": " : "",
                g->why);
        fflush(out);
    }
    print_table(out, R);
    if (json)
        print_json(stdout, R);
    if (!strncmp(status, "cuda", 4))
        write_results(v[F_RESULTS] ? v[F_RESULTS] : DEFAULT_RESULTS, R, out);
    ret = 0;
    for (int i = 0; i < R->nruns; i++) {
        const grun *g = &R->runs[i];
        if (g->state == CELL_FAIL)
            ret = 1;
        if (g->state != CELL_OK)
            continue;
        for (int si = 0; si < NSHAPES; si++) {
            if (g->lim[si].state != CELL_OK)
                ret = 1;
            for (int t = 0; t < NT; t++)
                if (g->cells[t][si].state != CELL_OK)
                    ret = 1;
        }
    }
out:
    if (pid > 0) {
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
    }
    kvp_free(R);
    kvp_free(orig);
    return ret;
}
