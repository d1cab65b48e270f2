/*
 * bench_disk.c -- `kvpool bench disk`: the SSD tier's store
 * (node/disk.h) against fio on the same directory, in one run.
 *
 *  1. write: --size bytes of --value-byte values (fresh keys, checksums
 *     computed before the timing: a node has them from the master) through
 *     kvp_disk_write (which copies each into its staging), as fast as the
 *     writer takes them (a -200 is retried after 50 us: back-pressure, not
 *     a failure), then kvp_disk_flush (everything durable). GB/s = value
 *     bytes / wall time (10^9 B/s). The writer uses io_uring at --depth.
 *  2. read: --readers threads read every value once (a shuffled order),
 *     each verified against its checksum by the store; GB/s likewise. The
 *     store reads with pread on O_DIRECT files: queue depth = readers.
 *  3. restart: close and open again (the page index files), then once more
 *     without them (every record header read from its page and every value
 *     verified, as after a crash): records found and time for each. Then
 *     --restart-records small records (4000 bytes) are written into a second
 *     directory and reopened from their indexes: the startup time for that
 *     many records (the "1 M records"; the default is smaller to
 *     stay quick, pass 1000000 for the full figure). Then the whole warm
 *     restart on them: `kvpool serve` with that directory as its SSD tier,
 *     timed from the spawn until its master lists every record.
 *  4. fio (Debian's fio, skipped when absent): the same bytes, block size
 *     = the value size, O_DIRECT, io_uring; write at iodepth --depth
 *     (end_fsync), random read at iodepth --readers.
 * Target: the store >= 0.8 x fio, both ways. Everything it writes is
 * removed at the end. Exit status 1 when a measurement failed (a wrong or
 * missing value is a failure).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "bench/bench.h"
#include "cli/cli.h"
#include "common/clock.h"
#include "common/log.h"
#include "kvpool.h"
#include "node/disk.h"

#define TARGET 0.8

typedef struct opts {
    char dir[512];
    uint64_t size, value, restart_records;
    uint64_t depth, readers;
    int json, no_fio;
} opts;

typedef struct res {
    int ok;
    char why[1024];
    double w_gbps, r_gbps, w_s, r_s;
    uint64_t values, pressure;
    double reopen_ms, rescan_ms, small_ms, register_ms;
    uint64_t reopen_recs, rescan_recs, small_recs, registered;
    double fio_w, fio_r;
    char fio_why[256];
    const char *io;
} res;

static void key_of(char *k, size_t n, const char *pfx, uint64_t i)
{
    snprintf(k, n, "%s-%08llu", pfx, (unsigned long long)i);
}

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
}

static void rm_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[1100];
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    if (d)
        closedir(d);
    rmdir(dir);
}

static kvp_disk *open_store(const char *dir, uint64_t cap, uint64_t depth, char *why, size_t wl)
{
    kvp_disk_opts o = {.dir = dir, .capacity = cap, .page_size = 128u << 20,
                       .staging_budget = 512u << 20, .io_depth = (int)depth};
    kvp_disk *d = NULL;
    char err[512];
    int rc = kvp_disk_open(&o, &d, err, sizeof err);
    if (rc)
        snprintf(why, wl, "open %s: %s", dir, err);
    return d;
}

typedef struct rarg {
    kvp_disk *d;
    const opts *o;
    uint64_t from, n, stride; /* reads keys perm(from + k * stride) */
    uint64_t bad;
} rarg;

static uint64_t perm(uint64_t i, uint64_t n) { return (i * 2654435761ull + 12345) % n; }

static void *reader(void *p)
{
    rarg *a = p;
    uint8_t *buf = malloc(a->o->value);
    for (uint64_t k = 0; buf && k < a->n; k++) {
        uint64_t i = perm(a->from + k * a->stride, a->o->size / a->o->value);
        char key[64];
        key_of(key, sizeof key, "v", i);
        int64_t r = kvp_disk_read(a->d, (const uint8_t *)"default", 7, (const uint8_t *)key,
                                  (uint32_t)strlen(key), buf, a->o->value, NULL);
        if (r != (int64_t)a->o->value)
            a->bad++;
    }
    free(buf);
    return NULL;
}

/* 1: write, 2: read, 3: restarts. */
static void bench_store(const opts *o, res *r)
{
    uint64_t n = o->size / o->value;
    uint64_t cap = (o->size + o->size / 4 + (256u << 20)) & ~((128ull << 20) - 1);
    rm_dir(o->dir); /* what an interrupted run left would count against capacity */
    kvp_disk *d = open_store(o->dir, cap, o->depth, r->why, sizeof r->why);
    if (!d)
        return;
    uint8_t *v = malloc(o->value);
    if (!v) {
        kvp_disk_close(d);
        snprintf(r->why, sizeof r->why, "out of memory");
        return;
    }
    fill(v, o->value, 1);
    /* values differ in their first byte; their checksums are known before
     * the timing starts, as a node knows them from the master */
    uint64_t cs256[256];
    for (int b = 0; b < 256; b++) {
        v[0] = (uint8_t)b;
        cs256[b] = XXH3_64bits(v, o->value);
    }
    uint64_t t0 = kvp_now_ns();
    for (uint64_t i = 0; i < n; i++) {
        char key[64];
        key_of(key, sizeof key, "v", i);
        v[0] = (uint8_t)i;
        struct iovec iv = {v, o->value};
        uint64_t cs = cs256[i & 255];
        int rc;
        while ((rc = kvp_disk_write(d, (const uint8_t *)"default", 7, (const uint8_t *)key,
                                    (uint32_t)strlen(key), cs, &iv, 1, o->value, NULL)) ==
               KVP_ENO_AVAILABLE_HANDLE)
            usleep(50);
        if (rc) {
            snprintf(r->why, sizeof r->why, "write: %s", kvp_strerror(rc));
            goto out;
        }
    }
    kvp_disk_flush(d);
    r->w_s = (double)(kvp_now_ns() - t0) / 1e9;
    r->w_gbps = (double)(n * o->value) / r->w_s / 1e9;
    kvp_disk_stats st;
    kvp_disk_get_stats(d, &st);
    r->pressure = st.pressure;
    r->io = st.io;
    if (st.records != n || st.write_errors) {
        snprintf(r->why, sizeof r->why, "write: %llu records of %llu, %llu errors",
                 (unsigned long long)st.records, (unsigned long long)n,
                 (unsigned long long)st.write_errors);
        goto out;
    }
    /* 2: read */
    pthread_t th[64];
    rarg ra[64];
    uint64_t nr = o->readers;
    t0 = kvp_now_ns();
    for (uint64_t t = 0; t < nr; t++) {
        ra[t] = (rarg){d, o, t, (n - t + nr - 1) / nr, nr, 0};
        pthread_create(&th[t], NULL, reader, &ra[t]);
    }
    uint64_t bad = 0;
    for (uint64_t t = 0; t < nr; t++) {
        pthread_join(th[t], NULL);
        bad += ra[t].bad;
    }
    r->r_s = (double)(kvp_now_ns() - t0) / 1e9;
    r->r_gbps = (double)(n * o->value) / r->r_s / 1e9;
    if (bad) {
        snprintf(r->why, sizeof r->why, "read: %llu values wrong or missing", (unsigned long long)bad);
        goto out;
    }
    /* 3: restarts */
    kvp_disk_close(d);
    t0 = kvp_now_ns();
    d = open_store(o->dir, cap, o->depth, r->why, sizeof r->why);
    r->reopen_ms = (double)(kvp_now_ns() - t0) / 1e6;
    if (!d)
        goto out;
    kvp_disk_get_stats(d, &st);
    r->reopen_recs = st.records;
    kvp_disk_close(d);
    DIR *dd = opendir(o->dir);
    struct dirent *e;
    char p[1100];
    while (dd && (e = readdir(dd)))
        if (strstr(e->d_name, ".idx")) {
            snprintf(p, sizeof p, "%s/%s", o->dir, e->d_name);
            unlink(p);
        }
    if (dd)
        closedir(dd);
    t0 = kvp_now_ns();
    d = open_store(o->dir, cap, o->depth, r->why, sizeof r->why);
    r->rescan_ms = (double)(kvp_now_ns() - t0) / 1e6;
    if (!d)
        goto out;
    kvp_disk_get_stats(d, &st);
    r->rescan_recs = st.records;
    if (r->reopen_recs != n || r->rescan_recs != n) {
        snprintf(r->why, sizeof r->why, "restart: %llu and %llu records of %llu",
                 (unsigned long long)r->reopen_recs, (unsigned long long)r->rescan_recs,
                 (unsigned long long)n);
        goto out;
    }
    r->ok = 1;
out:
    free(v);
    kvp_disk_close(d);
    rm_dir(o->dir);
}

/* 3c: the whole warm restart: `kvpool serve` with its SSD tier on dir
 * (n records) until its master lists every record (the node opens the
 * store, mounts, and reports what it holds). */
static void bench_register(const char *dir, uint64_t cap, uint64_t n, res *r)
{
    char capv[32], addr[300];
    snprintf(capv, sizeof capv, "%llu", (unsigned long long)cap);
    const char *args[] = {"serve", "--segment-size", "64MiB", "--log-level", "warn",
                          "--enable-offload", "--offload-dir", dir, "--offload-capacity", capv,
                          NULL};
    uint64_t t0 = kvp_now_ns();
    pid_t pid = kvp_cli_spawn_self(args, 60000, addr, sizeof addr);
    if (pid <= 0) {
        r->ok = 0;
        snprintf(r->why, sizeof r->why, "could not start `kvpool serve` on %s", dir);
        return;
    }
    char cfg[400], err[256], *stats = malloc(65536);
    snprintf(cfg, sizeof cfg, "{\"master\": \"%s\", \"mode\": \"standalone-store\"}", addr);
    kvp_client *c = NULL;
    if (stats && kvp_client_open(cfg, &c, err, sizeof err) == 0) {
        uint64_t end = kvp_now_ms() + 120000;
        while (kvp_now_ms() < end) {
            if (kvp_client_stat(c, stats, 65536) > 0) {
                const char *p = strstr(stats, "\"disk_registered\": ");
                r->registered = p ? strtoull(p + 19, NULL, 10) : 0;
                if (r->registered >= n)
                    break;
            }
            usleep(5000);
        }
        r->register_ms = (double)(kvp_now_ns() - t0) / 1e6;
        kvp_client_close(c);
    }
    free(stats);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    if (r->registered != n) {
        r->ok = 0;
        snprintf(r->why, sizeof r->why, "warm restart: the master lists %llu of %llu records",
                 (unsigned long long)r->registered, (unsigned long long)n);
    }
}

/* 3b: startup time for many small records. */
static void bench_small(const opts *o, res *r)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s-small", o->dir);
    uint64_t n = o->restart_records;
    uint64_t cap = ((n * 4096 + n * 4096 / 4) & ~((128ull << 20) - 1)) + (512ull << 20);
    rm_dir(dir);
    kvp_disk *d = open_store(dir, cap, o->depth, r->why, sizeof r->why);
    if (!d) {
        r->ok = 0;
        return;
    }
    uint8_t v[4000];
    fill(v, sizeof v, 2);
    for (uint64_t i = 0; i < n; i++) {
        char key[64];
        key_of(key, sizeof key, "s", i);
        struct iovec iv = {v, sizeof v};
        while (kvp_disk_write(d, (const uint8_t *)"default", 7, (const uint8_t *)key,
                              (uint32_t)strlen(key), XXH3_64bits(v, sizeof v), &iv, 1,
                              sizeof v, NULL) == KVP_ENO_AVAILABLE_HANDLE)
            usleep(50);
    }
    kvp_disk_close(d);
    uint64_t t0 = kvp_now_ns();
    d = open_store(dir, cap, o->depth, r->why, sizeof r->why);
    r->small_ms = (double)(kvp_now_ns() - t0) / 1e6;
    if (d) {
        kvp_disk_stats st;
        kvp_disk_get_stats(d, &st);
        r->small_recs = st.records;
        kvp_disk_close(d);
    }
    if (r->small_recs != n) {
        r->ok = 0;
        snprintf(r->why, sizeof r->why, "small records: %llu found of %llu",
                 (unsigned long long)r->small_recs, (unsigned long long)n);
    } else {
        bench_register(dir, cap, n, r);
    }
    rm_dir(dir);
}

/* Runs fio with args; its bandwidth (bytes/s) of `what` ("write", "read"), or < 0. */
static double fio_run(const opts *o, const char *const *args, const char *what, char *why,
                      size_t wl)
{
    char out[600];
    snprintf(out, sizeof out, "%s-fio.json", o->dir);
    const char *argv[32];
    int n = 0;
    argv[n++] = "fio";
    for (int i = 0; args[i] && n < 28; i++)
        argv[n++] = args[i];
    char outarg[700];
    snprintf(outarg, sizeof outarg, "--output=%s", out);
    argv[n++] = "--output-format=json";
    argv[n++] = outarg;
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        int nul = open("/dev/null", O_WRONLY);
        if (nul >= 0) {
            dup2(nul, 1);
            dup2(nul, 2);
        }
        execvp("fio", (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status)) {
        snprintf(why, wl, "fio %s", WIFEXITED(status) && WEXITSTATUS(status) == 127
                                        ? "is not installed" : "failed");
        unlink(out);
        return -1;
    }
    json_error_t je;
    json_t *j = json_load_file(out, 0, &je);
    unlink(out);
    json_t *job = j ? json_array_get(json_object_get(j, "jobs"), 0) : NULL;
    json_t *bw = job ? json_object_get(json_object_get(job, what), "bw_bytes") : NULL;
    double v = json_is_number(bw) ? json_number_value(bw) : -1;
    json_decref(j);
    if (v <= 0)
        snprintf(why, wl, "fio: no %s bandwidth in its output", what);
    return v;
}

static void bench_fio(const opts *o, res *r)
{
    if (o->no_fio) {
        snprintf(r->fio_why, sizeof r->fio_why, "--no-fio");
        return;
    }
    mkdir(o->dir, 0700);
    char dirarg[600], bs[64], size[64], wd[64], rd[64];
    snprintf(dirarg, sizeof dirarg, "--directory=%s", o->dir);
    snprintf(bs, sizeof bs, "--bs=%llu", (unsigned long long)o->value);
    snprintf(size, sizeof size, "--size=%llu", (unsigned long long)(o->size / o->value * o->value));
    snprintf(wd, sizeof wd, "--iodepth=%llu", (unsigned long long)o->depth);
    snprintf(rd, sizeof rd, "--iodepth=%llu", (unsigned long long)o->readers);
    const char *w[] = {"--name=kvpool-disk", dirarg, "--filename=fio.dat", "--rw=write", bs, size,
                       "--direct=1", "--ioengine=io_uring", wd, "--end_fsync=1", NULL};
    double wb = fio_run(o, w, "write", r->fio_why, sizeof r->fio_why);
    const char *rr[] = {"--name=kvpool-disk", dirarg, "--filename=fio.dat", "--rw=randread", bs,
                        size, "--direct=1", "--ioengine=io_uring", rd, NULL};
    double rb = wb > 0 ? fio_run(o, rr, "read", r->fio_why, sizeof r->fio_why) : -1;
    r->fio_w = wb > 0 ? wb / 1e9 : 0;
    r->fio_r = rb > 0 ? rb / 1e9 : 0;
    rm_dir(o->dir);
}

static void usage(void)
{
    printf("usage: kvpool bench disk [--dir DIR] [--size SIZE] [--value SIZE] [--depth N]\n"
           "                         [--readers N] [--restart-records N] [--no-fio] [--json]\n\n"
           "The SSD tier's store against fio on the same directory (see the header of\n"
           "src/bench/bench_disk.c for the method).\n"
           "  --dir DIR             where to write (default /tmp/kvpool-bench-disk; removed after)\n"
           "  --size SIZE           bytes written and read (default 2GiB)\n"
           "  --value SIZE          one value = one fio block (default 2MiB)\n"
           "  --depth N             writes in flight, both (default 32)\n"
           "  --readers N           reader threads = fio's read iodepth (default 8)\n"
           "  --restart-records N   small records for the startup time (default 200000)\n"
           "  --no-fio              skip fio\n"
           "  --json                results as JSON on stdout (the table goes to stderr)\n");
}

int kvp_bench_disk(int argc, char **argv)
{
    static const kvp_cli_flag own[] = {{"json", KVP_CLI_BOOL},    {"dir", KVP_CLI_TEXT},
                                       {"size", KVP_CLI_TEXT},    {"value", KVP_CLI_TEXT},
                                       {"depth", KVP_CLI_TEXT},   {"readers", KVP_CLI_TEXT},
                                       {"restart-records", KVP_CLI_TEXT},
                                       {"no-fio", KVP_CLI_BOOL},  {NULL, 0}};
    const char *v[9] = {0};
    int rc = kvp_cli_scan(argc, argv, own, v, NULL);
    if (rc == 1) {
        usage();
        return 0;
    }
    opts o = {"", 2ull << 30, 2u << 20, 200000, 32, 8, v[0] != NULL, v[7] != NULL};
    snprintf(o.dir, sizeof o.dir, "%s", v[1] ? v[1] : "/tmp/kvpool-bench-disk");
    if (rc < 0 || (v[2] && kvp_cli_size("bench disk", "size", v[2], 64u << 20, 1ull << 44, &o.size)) ||
        (v[3] && kvp_cli_size("bench disk", "value", v[3], 4096, 64u << 20, &o.value)) ||
        (v[4] && kvp_cli_uint("bench disk", "depth", v[4], 1, 256, &o.depth)) ||
        (v[5] && kvp_cli_uint("bench disk", "readers", v[5], 1, 64, &o.readers)) ||
        (v[6] && kvp_cli_uint("bench disk", "restart-records", v[6], 1, 100000000,
                              &o.restart_records)))
        return 2;
    kvp_log_set_level(KVP_LOG_WARN);
    FILE *tab = o.json ? stderr : stdout;
    fprintf(tab, "kvpool bench disk: %s, %llu MiB of %llu KiB values, depth %llu, %llu readers\n",
            o.dir, (unsigned long long)(o.size >> 20), (unsigned long long)(o.value >> 10),
            (unsigned long long)o.depth, (unsigned long long)o.readers);
    res r = {0};
    bench_store(&o, &r);
    if (r.ok)
        bench_small(&o, &r);
    bench_fio(&o, &r);
    if (!r.ok) {
        fprintf(stderr, "kvpool bench disk: %s\n", r.why);
    } else {
        fprintf(tab, "  %-12s %10s %10s\n", "", "write GB/s", "read GB/s");
        fprintf(tab, "  %-12s %10.2f %10.2f   (%s, %llu x -200 retried)\n", "kvpool disk",
                r.w_gbps, r.r_gbps, r.io, (unsigned long long)r.pressure);
        if (r.fio_w > 0)
            fprintf(tab, "  %-12s %10.2f %10.2f\n  %-12s %10.2f %10.2f   target >= %.1f: %s\n",
                    "fio", r.fio_w, r.fio_r, "ratio", r.w_gbps / r.fio_w, r.r_gbps / r.fio_r,
                    TARGET, r.w_gbps >= TARGET * r.fio_w && r.r_gbps >= TARGET * r.fio_r ? "met"
                                                                                        : "MISSED");
        else
            fprintf(tab, "  fio: skipped (%s)\n", r.fio_why);
        fprintf(tab, "  restart: %llu records from page indexes in %.0f ms, by a full scan "
                     "(values verified) in %.0f ms; %llu small records in %.0f ms "
                     "(%.1f s per million); kvpool serve on them until its master lists "
                     "all %llu: %.0f ms\n",
                (unsigned long long)r.reopen_recs, r.reopen_ms, r.rescan_ms,
                (unsigned long long)r.small_recs, r.small_ms,
                r.small_recs ? r.small_ms / 1000.0 * 1e6 / (double)r.small_recs : 0.0,
                (unsigned long long)r.registered, r.register_ms);
    }
    if (o.json) {
        json_t *j = json_pack("{s:s, s:b, s:s, s:I, s:I, s:I, s:I}", "bench", "disk", "ok", r.ok,
                              "dir", o.dir, "bytes", (json_int_t)o.size, "value",
                              (json_int_t)o.value, "depth", (json_int_t)o.depth, "readers",
                              (json_int_t)o.readers);
        if (r.ok) {
            json_object_set_new(j, "kvpool", json_pack("{s:f, s:f, s:s, s:I}", "write_gbps",
                                                       r.w_gbps, "read_gbps", r.r_gbps, "io",
                                                       r.io, "pressure_retries",
                                                       (json_int_t)r.pressure));
            json_object_set_new(j, "restart",
                                json_pack("{s:I, s:f, s:f, s:I, s:f, s:f}", "records",
                                          (json_int_t)r.reopen_recs, "from_indexes_ms",
                                          r.reopen_ms, "full_scan_ms", r.rescan_ms,
                                          "small_records", (json_int_t)r.small_recs,
                                          "small_ms", r.small_ms, "serve_registered_ms",
                                          r.register_ms));
        }
        if (r.fio_w > 0)
            json_object_set_new(j, "fio", json_pack("{s:f, s:f, s:f, s:f}", "write_gbps",
                                                    r.fio_w, "read_gbps", r.fio_r,
                                                    "write_ratio", r.w_gbps / r.fio_w,
                                                    "read_ratio", r.r_gbps / r.fio_r));
        else
            json_object_set_new(j, "fio", json_pack("{s:s}", "skipped", r.fio_why));
        if (!r.ok)
            json_object_set_new(j, "error", json_string(r.why));
        char *s = json_dumps(j, JSON_INDENT(2));
        if (s)
            printf("%s\n", s);
        free(s);
        json_decref(j);
    }
    return r.ok ? 0 : 1;
}
