/*
 * test_first_minute.c -- the defaults a newcomer meets in the first minute,
 * run as real processes:
 *
 *   - `kvpool serve --segment-size 4GiB` serves at once (first touch of
 *     fresh memory runs at ~0.3 GB/s on small machines: 14 s for 4 GiB if
 *     it faulted the segment in before serving) and serves put/get
 *     correctly while its pages are faulted in behind the requests;
 *   - a CLI put/get against it, or against a 1 GiB node, does not
 *     map-populate the whole segment (its peak RSS, from wait4's rusage,
 *     stays far below the segment's size);
 *   - a segment larger than the machine can back is refused at start with a
 *     message naming the limit: serve and store exit 2 within a second,
 *     kvp_client_open of an embedded client answers KVP_ECONFIG; an
 *     offload_capacity larger than the filesystem is warned about;
 *   - a plain kvp_client_open({"master": ...}) contributes no memory (its
 *     puts land on the pool's nodes and outlive it); an embedded client's
 *     segment costs nothing until used;
 *   - segment_prefault: sync faults in before serving, off never, the
 *     default (background) behind the first requests; all logged.
 *
 * Memory: this machine may be small and shared; only serve_4gib holds a
 * 4 GiB segment (memfd pages are freed when the process exits).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/config.h"
#include "harness.h"
#include "kvpool.h"
#include "proc.h"

#define MiB (1024u * 1024u)

/* A private temp dir for a test's files; removed by tp_rm_dir. */
static int mk_dir(char *dir, size_t n)
{
    snprintf(dir, n, "/tmp/kvp-first-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

/* fork + execv(argv), stdin from in_path (or /dev/null), stdout to
 * out_path (or /dev/null), stderr to err_path (or inherited). The pid or -1. */
static pid_t spawn(const char *const *argv, const char *in_path, const char *out_path,
                   const char *err_path)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    int in = open(in_path ? in_path : "/dev/null", O_RDONLY);
    int out = out_path ? open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600)
                       : open("/dev/null", O_WRONLY);
    if (in < 0 || out < 0)
        _exit(126);
    dup2(in, 0);
    dup2(out, 1);
    if (err_path) {
        int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (e < 0)
            _exit(126);
        dup2(e, 2);
    }
    execv(argv[0], (char *const *)argv);
    _exit(127);
}

/* Waits (bounded) for pid with wait4: its exit status (128 + signal when
 * killed), and its peak RSS in KiB in *rss_kb; -1 on timeout (killed). */
static int wait_rss(pid_t pid, int timeout_ms, long *rss_kb)
{
    uint64_t end = tp_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        int st;
        struct rusage ru;
        pid_t r = wait4(pid, &st, WNOHANG, &ru);
        if (r == pid) {
            *rss_kb = ru.ru_maxrss;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        if ((r < 0 && errno != EINTR) || tp_now_ms() >= end) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        tp_sleep_ms(5);
    }
}

/* The whole of a small file (NUL-terminated, at most cap-1 bytes); its length or -1. */
static long slurp(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = 0;
    return (long)n;
}

static int write_bytes(const char *path, const uint8_t *p, size_t n)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    int ok = fwrite(p, 1, n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* This process's resident set (VmRSS), in KiB; -1 if unknown. */
static long self_rss_kb(void)
{
    char buf[8192];
    if (slurp("/proc/self/status", buf, sizeof buf) < 0)
        return -1;
    const char *p = strstr(buf, "VmRSS:");
    return p ? strtol(p + 6, NULL, 10) : -1;
}

/* `kvpool serve --segment-size 4GiB` answers and holds a mounted segment within
 * 4 s of its start (the old code faulted the 4 GiB in first: ~14 s here),
 * logs that it is faulting in behind the requests, and meanwhile serves
 * put/get byte-exact, from this process and from the CLI; the CLI's peak
 * RSS stays far below 4 GiB (it no longer MAP_POPULATEs the segment). */
TEST(serve_4gib)
{
    char dir[64], pf[128], log[128], val[128], got[128], text[16384];
    CHECK(mk_dir(dir, sizeof dir) == 0);
    snprintf(pf, sizeof pf, "%s/port", dir);
    snprintf(log, sizeof log, "%s/serve.log", dir);
    snprintf(val, sizeof val, "%s/value", dir);
    snprintf(got, sizeof got, "%s/got", dir);
    const char *sv[] = {tp_kvpool_bin(), "serve", "--listen", "127.0.0.1:0", "--port-file", pf,
                        "--segment-size", "4GiB", NULL};
    uint64_t t0 = tp_now_ms();
    tp_master m = {0};
    m.pid = spawn(sv, NULL, NULL, log);
    CHECK(m.pid > 0);
    /* ready: the port file, then the mounted segment, within 4 s */
    unsigned port = 0;
    while (!port && tp_now_ms() - t0 < 4000) {
        FILE *f = fopen(pf, "r");
        if (!f || fscanf(f, "%u", &port) != 1)
            port = 0;
        if (f)
            fclose(f);
        if (!port)
            tp_sleep_ms(20);
    }
    snprintf(m.addr, sizeof m.addr, "127.0.0.1:%u", port);
    int segs = 0;
    while (port && segs != 1 && tp_now_ms() - t0 < 4000)
        if ((segs = tp_master_segments(m.addr)) != 1)
            tp_sleep_ms(20);
    uint64_t ready_ms = tp_now_ms() - t0;
    printf("  serve 4GiB: ready after %llu ms\n", (unsigned long long)ready_ms);
    if (!port || segs != 1) {
        tp_master_kill(&m);
        tp_rm_dir(dir);
        CHECK(port != 0);
        CHECK_EQ(segs, 1);
    }
    CHECK(slurp(log, text, sizeof text) > 0);
    CHECK(strstr(text, "faulting in 4.0 GiB in the background") != NULL);

    /* put/get from this process while the pages are being faulted in: values
     * land at the lowest offsets, where the prefault is working */
    char conf[160], err[512];
    snprintf(conf, sizeof conf, "{\"master\": \"%s\", \"mode\": \"standalone-store\"}", m.addr);
    kvp_client *c = NULL;
    CHECK_EQ(kvp_client_open(conf, &c, err, sizeof err), 0);
    enum { N = 24, SZ = 1 * MiB + 4096 + 17 };
    uint8_t *v = malloc(SZ), *w = malloc(SZ);
    CHECK(v && w);
    int bad = 0;
    for (int i = 0; i < N && !bad; i++) {
        char k[32];
        snprintf(k, sizeof k, "early-%d", i);
        tp_fill(v, SZ, (uint64_t)i);
        bad |= kvp_client_put(c, k, v, SZ) != 0;
    }
    for (int i = 0; i < N && !bad; i++) {
        char k[32];
        snprintf(k, sizeof k, "early-%d", i);
        tp_fill(v, SZ, (uint64_t)i);
        bad |= kvp_client_get(c, k, w, SZ) != SZ || memcmp(v, w, SZ) != 0;
    }
    kvp_client_close(c);
    CHECK(!bad);

    /* the CLI: a put and a get of 1 MiB; each process's peak RSS stays far
     * below the segment (the old one mapped all 4 GiB populated: ~4.2 GB) */
    tp_fill(v, MiB, 99);
    CHECK(write_bytes(val, v, MiB) == 0);
    const char *put[] = {tp_kvpool_bin(), "put", "cli-key", val, "--master", m.addr, NULL};
    long rss_put = 0, rss_get = 0;
    pid_t p = spawn(put, NULL, NULL, NULL);
    CHECK_EQ(wait_rss(p, 20000, &rss_put), 0);
    const char *get[] = {tp_kvpool_bin(), "get", "cli-key", "--master", m.addr, NULL};
    p = spawn(get, NULL, got, NULL);
    CHECK_EQ(wait_rss(p, 20000, &rss_get), 0);
    printf("  CLI peak RSS: put %ld KiB, get %ld KiB\n", rss_put, rss_get);
    CHECK(rss_put > 0 && rss_put < 512 * 1024);
    CHECK(rss_get > 0 && rss_get < 512 * 1024);
    FILE *f = fopen(got, "r");
    CHECK(f != NULL);
    size_t n = fread(w, 1, SZ, f);
    fclose(f);
    CHECK(n == MiB && memcmp(v, w, MiB) == 0);
    free(v);
    free(w);

    /* a stop in the middle of the prefault is clean and prompt */
    CHECK_EQ(tp_master_stop(&m), 0);
    tp_rm_dir(dir);
}

/* The CLI against a 1 GiB node, alone (the old client MAP_POPULATEd the
 * whole segment at attach: peak RSS above 1 GiB for a 64 KiB put): a put and
 * a get stay far below the segment's size, and read back the bytes. */
TEST(cli_attach_is_lazy)
{
    tp_master m;
    tp_store s;
    char dir[64], val[128], got[128];
    CHECK(mk_dir(dir, sizeof dir) == 0);
    snprintf(val, sizeof val, "%s/value", dir);
    snprintf(got, sizeof got, "%s/got", dir);
    CHECK(tp_master_start(&m, NULL) == 0);
    CHECK(tp_store_start(&s, m.addr, (const char *const[]){"--segment-size", "1GiB", NULL}) ==
          0);
    enum { SZ = 64 * 1024 };
    uint8_t v[SZ], w[SZ];
    tp_fill(v, SZ, 5);
    CHECK(write_bytes(val, v, SZ) == 0);
    const char *put[] = {tp_kvpool_bin(), "put", "lazy-cli", val, "--master", m.addr, NULL};
    const char *get[] = {tp_kvpool_bin(), "get", "lazy-cli", "--master", m.addr, NULL};
    long rss_put = 0, rss_get = 0;
    CHECK_EQ(wait_rss(spawn(put, NULL, NULL, NULL), 20000, &rss_put), 0);
    CHECK_EQ(wait_rss(spawn(get, NULL, got, NULL), 20000, &rss_get), 0);
    printf("  CLI peak RSS against 1 GiB: put %ld KiB, get %ld KiB\n", rss_put, rss_get);
    CHECK(rss_put > 0 && rss_put < 256 * 1024);
    CHECK(rss_get > 0 && rss_get < 256 * 1024);
    FILE *f = fopen(got, "r");
    CHECK(f != NULL);
    size_t n = fread(w, 1, SZ, f);
    fclose(f);
    CHECK(n == SZ && memcmp(v, w, SZ) == 0);
    tp_rm_dir(dir);
    CHECK_EQ(tp_store_stop(&s), 0);
    CHECK_EQ(tp_master_stop(&m), 0);
}

/* --segment-size 64TB: serve and store refuse at once (exit 2, within a
 * second) with the limit named; the old code tried and grew until the OOM
 * killer ended it (here: killed by the capture's timeout). */
TEST(huge_segment_refused_by_serve_and_store)
{
    char out[4096];
    const char *sv[] = {tp_kvpool_bin(), "serve", "--listen", "127.0.0.1:0",
                        "--segment-size", "64TB", NULL};
    const char *st[] = {tp_kvpool_bin(), "store", "--master", "127.0.0.1:1",
                        "--segment-size", "64TB", NULL};
    const char *const *cmds[] = {sv, st};
    for (int i = 0; i < 2; i++) {
        uint64_t t0 = tp_now_ms();
        CHECK_EQ(tp_run_capture(cmds[i], 2, out, sizeof out, 3000), 2);
        uint64_t dt = tp_now_ms() - t0;
        CHECK(dt < 1000);
        CHECK(strstr(out, "segment size 64.0 TiB exceeds the memory this machine can back") !=
              NULL);
        CHECK(strstr(out, "MemTotal") != NULL || strstr(out, "memory cgroup limit") != NULL);
        CHECK(strstr(out, "may be at most") != NULL);
        CHECK(strstr(out, i ? "kvpool store: " : "kvpool serve: ") != NULL);
    }
}

/* An embedded client whose global_segment_size the machine cannot back:
 * kvp_client_open answers KVP_ECONFIG naming the limit, before it starts
 * anything. In a child with an alarm: the old code started faulting 64 TiB. */
TEST(embedded_huge_segment_refused)
{
    tp_master m;
    CHECK(tp_master_start(&m, NULL) == 0);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(5);
        char conf[160], err[512];
        snprintf(conf, sizeof conf,
                 "{\"master\": \"%s\", \"mode\": \"embedded\", \"global_segment_size\": \"64TB\"}",
                 m.addr);
        kvp_client *c = NULL;
        int rc = kvp_client_open(conf, &c, err, sizeof err);
        printf("  kvp_client_open: %d: %s\n", rc, err);
        fflush(stdout);
        _exit(rc == KVP_ECONFIG && c == NULL && strstr(err, "64.0 TiB exceeds") &&
                      strstr(err, "at most")
                  ? 0
                  : 1);
    }
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_EQ(tp_master_segments(m.addr), 0);
    CHECK_EQ(tp_master_stop(&m), 0);
}

/* A plain client names no memory, so it contributes none: no segment of
 * its own, its puts land on the pool's storage node and outlive it (the
 * old default was an embedded 4 GiB segment: 13 s to open, and puts kept
 * in the client's own memory vanished with it). */
TEST(plain_client_is_standalone)
{
    tp_master m;
    tp_store s;
    CHECK(tp_master_start(&m, NULL) == 0);
    CHECK(tp_store_start(&s, m.addr, (const char *const[]){"--segment-size", "16MiB", NULL}) ==
          0);
    char conf[128], err[512];
    snprintf(conf, sizeof conf, "{\"master\": \"%s\"}", m.addr);
    uint64_t t0 = tp_now_ms();
    kvp_client *c = NULL;
    CHECK_EQ(kvp_client_open(conf, &c, err, sizeof err), 0);
    uint64_t dt = tp_now_ms() - t0;
    CHECK(dt < 3000);
    CHECK_EQ(strcmp(kvp_client_segment_name(c), ""), 0);
    CHECK_EQ(tp_master_segments(m.addr), 1);
    CHECK_EQ(kvp_client_put(c, "outlives", "hello", 5), 0);
    kvp_client_close(c);
    CHECK_EQ(kvp_client_open(conf, &c, err, sizeof err), 0);
    char b[8];
    CHECK_EQ(kvp_client_get(c, "outlives", b, sizeof b), 5);
    CHECK(memcmp(b, "hello", 5) == 0);
    kvp_client_close(c);
    /* giving global_segment_size (Mooncake configs do) still means embedded */
    snprintf(conf, sizeof conf, "{\"master\": \"%s\", \"global_segment_size\": \"8MiB\"}",
             m.addr);
    CHECK_EQ(kvp_client_open(conf, &c, err, sizeof err), 0);
    CHECK(strcmp(kvp_client_segment_name(c), "") != 0);
    CHECK_EQ(tp_master_segments(m.addr), 2);
    kvp_client_close(c);
    CHECK_EQ(tp_store_stop(&s), 0);
    CHECK_EQ(tp_master_stop(&m), 0);
}

/* An embedded client's segment is faulted in lazily: opening one of 1 GiB
 * adds far less than 1 GiB to the process (the old one faulted it all in
 * before kvp_client_open returned), and it still stores values. */
TEST(embedded_segment_is_lazy)
{
    tp_master m;
    CHECK(tp_master_start(&m, NULL) == 0);
    char conf[160], err[512];
    snprintf(conf, sizeof conf,
             "{\"master\": \"%s\", \"mode\": \"embedded\", \"global_segment_size\": \"1GiB\"}",
             m.addr);
    long before = self_rss_kb();
    kvp_client *c = NULL;
    CHECK_EQ(kvp_client_open(conf, &c, err, sizeof err), 0);
    long after = self_rss_kb();
    printf("  embedded 1 GiB: RSS %ld -> %ld KiB\n", before, after);
    CHECK(before > 0 && after > 0 && after - before < 256 * 1024);
    CHECK_EQ(tp_master_segments(m.addr), 1);
    enum { SZ = 4 * MiB };
    uint8_t *v = malloc(SZ), *w = malloc(SZ);
    CHECK(v && w);
    tp_fill(v, SZ, 7);
    CHECK_EQ(kvp_client_put(c, "lazy", v, SZ), 0);
    CHECK_EQ(kvp_client_get(c, "lazy", w, SZ), SZ);
    CHECK(memcmp(v, w, SZ) == 0);
    free(v);
    free(w);
    kvp_client_close(c);
    CHECK_EQ(tp_master_stop(&m), 0);
}

/* segment_prefault: sync faults in before the segment server starts, off
 * never, the default in the background once the node's threads run; each
 * says so at INFO. */
TEST(segment_prefault_modes)
{
    char dir[64], log[128], text[16384];
    CHECK(mk_dir(dir, sizeof dir) == 0);
    const char *modes[] = {"sync", "off", NULL};
    for (int i = 0; i < 3; i++) {
        snprintf(log, sizeof log, "%s/store-%d.log", dir, i); /* fresh: no earlier lines */
        const char *argv[] = {tp_kvpool_bin(), "store", "--master", "127.0.0.1:1",
                              "--master-optional", "--listen", "127.0.0.1:0", "--segment-size",
                              "64MiB", "--log-level", "info",
                              modes[i] ? "--segment-prefault" : NULL, modes[i], NULL};
        pid_t pid = spawn(argv, NULL, NULL, log);
        CHECK(pid > 0);
        /* wait for the server line (and, but for off, the end of the prefault) */
        const char *srv = NULL, *done = NULL;
        uint64_t t0 = tp_now_ms();
        while (tp_now_ms() - t0 < 10000) {
            if (slurp(log, text, sizeof text) < 0)
                text[0] = 0;
            srv = strstr(text, "segserver: ");
            done = strstr(text, "segment 64.0 MiB faulted in in ");
            if (srv && (done || (modes[i] && !strcmp(modes[i], "off"))))
                break;
            tp_sleep_ms(20);
        }
        kill(pid, SIGTERM);
        int st = 0;
        waitpid(pid, &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        CHECK(srv != NULL);
        if (i == 0) {
            CHECK(strstr(text, "faulting in 64.0 MiB before serving") != NULL);
            CHECK(done != NULL && done < srv);
        } else if (i == 1) {
            CHECK(strstr(text, "faulting in") == NULL);
        } else {
            /* started once the node's threads are: their stacks are mmaps,
             * which would wait for its madvise calls */
            const char *bg = strstr(text, "faulting in 64.0 MiB in the background");
            CHECK(bg != NULL && srv < bg);
            CHECK(done != NULL);
        }
    }
    tp_rm_dir(dir);
}

/* An offload_capacity larger than the filesystem under offload_dir starts
 * (the tier survives a full disk: test_disk_tier) but says at start, naming
 * both, that the tier's own pages can fill the disk before it drops any;
 * the old code said nothing. */
TEST(offload_capacity_beyond_filesystem_warned)
{
    char dir[64], off[128], log[128], text[16384];
    CHECK(mk_dir(dir, sizeof dir) == 0);
    snprintf(off, sizeof off, "%s/tier", dir);
    snprintf(log, sizeof log, "%s/store.log", dir);
    const char *argv[] = {tp_kvpool_bin(), "store", "--master", "127.0.0.1:1",
                          "--master-optional", "--listen", "127.0.0.1:0", "--segment-size",
                          "4MiB", "--enable-offload", "--offload-dir", off,
                          "--offload-capacity", "1000TB", "--log-level", "info", NULL};
    pid_t pid = spawn(argv, NULL, NULL, log);
    CHECK(pid > 0);
    uint64_t t0 = tp_now_ms();
    text[0] = 0;
    while (tp_now_ms() - t0 < 10000 && !strstr(text, "segserver: "))
        if (slurp(log, text, sizeof text) < 0 || !strstr(text, "segserver: "))
            tp_sleep_ms(20);
    kill(pid, SIGTERM);
    int st = 0;
    waitpid(pid, &st, 0);
    tp_rm_dir(off);
    tp_rm_dir(dir);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(strstr(text, "key \"offload_capacity\" (1000.0 TiB) exceeds the size of the "
                       "filesystem of ") != NULL);
    CHECK(strstr(text, off) != NULL);
    CHECK(strstr(text, "give at most") != NULL);
}

/* The client's mode when "mode" is not given: embedded exactly when
 * global_segment_size is given and > 0 (Mooncake configs give it), else
 * standalone-store; an explicit mode is kept, and its rules still hold. */
TEST(mode_default_resolution)
{
    static const struct {
        const char *json, *mode;
        int ok;
    } cases[] = {
        {"{}", "standalone-store", 1},
        {"{\"global_segment_size\": \"1GiB\"}", "embedded", 1},
        {"{\"global_segment_size\": 0}", "standalone-store", 1},
        {"{\"mode\": \"embedded\"}", "embedded", 1}, /* with the 4 GiB default */
        {"{\"mode\": \"embedded\", \"global_segment_size\": 0}", "embedded", 0},
        {"{\"mode\": \"standalone-store\", \"global_segment_size\": \"1GiB\"}",
         "standalone-store", 0},
        {"{\"mode\": \"standalone-store\"}", "standalone-store", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvp_config c;
        char err[KVP_CONFIG_ERRLEN];
        kvp_config_defaults(&c);
        CHECK_EQ(kvp_config_load_string(&c, cases[i].json, err, sizeof err), 0);
        CHECK(strcmp(kvp_config_mode(&c), cases[i].mode) == 0);
        CHECK_EQ(kvp_config_validate(&c, err, sizeof err) == 0, cases[i].ok);
    }
}
