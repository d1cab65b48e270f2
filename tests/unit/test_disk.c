/*
 * test_disk.c -- the SSD tier's store (src/node/disk.c) on real files:
 * round trips of every size class, warm restart (from the page indexes and
 * from a page scan), a torn last record and corrupt records (never served,
 * reported), tombstones across restarts, whole-page LRU drops within
 * capacity, -200 back-pressure and its recovery, a full disk (a small
 * tmpfs) and its recovery, compaction, concurrent writes, reads, removes
 * and compaction (threads; TSan in `make tsan`), writes of a key completing
 * in queue order through the writer's pipeline, and nothing dropped or
 * removed coming back after a restart when an older page holding the key
 * survives (tombstone pages dropped for room or compacted, a newer value's
 * page dropped, a record dropped for its checksum), and a FORGET removing
 * only the record it names (never a newer one of the key, durable or still
 * queued, across restarts).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "harness.h"
#include "kvpool.h"
#include "node/disk.h"
#include "proc.h"

#define KiB 1024ull
#define MiB (1024ull * 1024)

/* ------------------------------------------------------------ fixture */

typedef struct cbs {
    pthread_mutex_t mu;
    int durable_ok, durable_err, last_err;
    int dropped;
    char dropped_keys[64][32];
} cbs;

static void on_durable(void *arg, const kvp_disk_rec *r, void *cookie, int status)
{
    cbs *c = arg;
    pthread_mutex_lock(&c->mu);
    if (status == 0)
        c->durable_ok++;
    else {
        c->durable_err++;
        c->last_err = status;
    }
    pthread_mutex_unlock(&c->mu);
}

static void on_dropped(void *arg, const kvp_disk_rec *r, size_t n)
{
    cbs *c = arg;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        if (c->dropped < 64)
            snprintf(c->dropped_keys[c->dropped], sizeof c->dropped_keys[0], "%.*s",
                     (int)r[i].key_len, (const char *)r[i].key);
        c->dropped++;
    }
    pthread_mutex_unlock(&c->mu);
}

static char g_dir[256];
static cbs g_cb;

static void mkdir_tmp(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/kvp-disk-XXXXXX");
    if (!mkdtemp(g_dir))
        g_dir[0] = 0;
    memset(&g_cb, 0, sizeof g_cb);
    pthread_mutex_init(&g_cb.mu, NULL);
}

static void rm_tmp(void)
{
    DIR *d = opendir(g_dir);
    struct dirent *e;
    char p[600];
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
            unlink(p);
        }
    if (d)
        closedir(d);
    rmdir(g_dir);
}

static kvp_disk *open_disk(uint64_t cap, uint64_t page, uint64_t staging, int io)
{
    kvp_disk_opts o = {.dir = g_dir, .capacity = cap, .page_size = page,
                       .staging_budget = staging, .io = io, .on_durable = on_durable,
                       .on_dropped = on_dropped, .arg = &g_cb};
    kvp_disk *d = NULL;
    char err[512];
    int rc = kvp_disk_open(&o, &d, err, sizeof err);
    if (rc)
        fprintf(stderr, "    kvp_disk_open: %s (%s)\n", err, kvp_err_name(rc));
    return d;
}

#define T (const uint8_t *)"default", 7
#define K(s) (const uint8_t *)(s), (uint32_t)strlen(s)

static int put(kvp_disk *d, const char *key, size_t n, uint64_t seed)
{
    uint8_t *v = malloc(n);
    tp_fill(v, n, seed);
    struct iovec iv = {v, n};
    int rc = kvp_disk_write(d, T, K(key), XXH3_64bits(v, n), &iv, 1, n, NULL);
    free(v);
    return rc;
}

/* 1 when key reads back as tp_fill(n, seed). */
static int holds(kvp_disk *d, const char *key, size_t n, uint64_t seed)
{
    uint8_t *got = malloc(n + 1), *want = malloc(n);
    tp_fill(want, n, seed);
    uint64_t cs = 0;
    int64_t r = kvp_disk_read(d, T, K(key), got, n + 1, &cs);
    int ok = r == (int64_t)n && memcmp(got, want, n) == 0 && cs == XXH3_64bits(want, n);
    free(got);
    free(want);
    return ok;
}

/* A page file (the first by name with this suffix), path into out. */
static int page_file(const char *suffix, int nth, char *out, size_t len)
{
    DIR *d = opendir(g_dir);
    struct dirent *e;
    char names[64][256];
    int n = 0;
    while (d && (e = readdir(d)) && n < 64)
        if (strstr(e->d_name, suffix) && !strstr(e->d_name, ".tmp"))
            snprintf(names[n++], sizeof names[0], "%s", e->d_name);
    if (d)
        closedir(d);
    qsort(names, (size_t)n, sizeof names[0], (int (*)(const void *, const void *))strcmp);
    if (nth >= n)
        return -1;
    snprintf(out, len, "%s/%s", g_dir, names[nth]);
    return 0;
}

static void flip_byte(const char *path, off_t off)
{
    int fd = open(path, O_RDWR);
    uint8_t b = 0;
    if (fd >= 0 && pread(fd, &b, 1, off) == 1) {
        b ^= 0x5A;
        if (pwrite(fd, &b, 1, off) != 1)
            b = 0;
    }
    if (fd >= 0)
        close(fd);
}

/* --------------------------------------------------------------- tests */

static const size_t k_sizes[] = {1, 4095, 4096, 4097, 100 * KiB, MiB + 5, 3 * MiB};
#define NS (sizeof k_sizes / sizeof k_sizes[0])

static void roundtrip_body(int io)
{
    mkdir_tmp();
    kvp_disk *d = open_disk(64 * MiB, 8 * MiB, 64 * MiB, io);
    CHECK(d);
    for (size_t i = 0; i < NS; i++) {
        char key[32];
        snprintf(key, sizeof key, "k%zu", i);
        CHECK_EQ(put(d, key, k_sizes[i], i), 0);
    }
    CHECK_EQ(kvp_disk_read(d, T, K("k0"), NULL, 0, NULL) < 0, 1); /* not yet durable, or too small */
    kvp_disk_flush(d);
    CHECK_EQ(g_cb.durable_ok, (int)NS);
    for (size_t i = 0; i < NS; i++) {
        char key[32];
        snprintf(key, sizeof key, "k%zu", i);
        CHECK(holds(d, key, k_sizes[i], i));
    }
    uint8_t small[10];
    CHECK_EQ(kvp_disk_read(d, T, K("k4"), small, sizeof small, NULL), KVP_EBUFFER_OVERFLOW);
    CHECK_EQ(kvp_disk_read(d, T, K("nope"), small, sizeof small, NULL), KVP_EOBJECT_NOT_FOUND);
    CHECK_EQ(kvp_disk_read(d, (const uint8_t *)"other", 5, K("k1"), small, sizeof small, NULL),
             KVP_EOBJECT_NOT_FOUND); /* tenants are namespaces */
    kvp_disk_stats st;
    kvp_disk_get_stats(d, &st);
    CHECK_EQ(st.records, NS);
    CHECK(!strcmp(st.io, io == KVP_DISK_IO_PWRITE ? "pwrite" : "io_uring"));
    kvp_disk_close(d);
    rm_tmp();
}

TEST(roundtrip_every_size_io_uring) { roundtrip_body(KVP_DISK_IO_AUTO); }
TEST(roundtrip_every_size_pwrite) { roundtrip_body(KVP_DISK_IO_PWRITE); }

static int g_each;
static void count_each(void *arg, const kvp_disk_rec *r) { g_each++; }

TEST(warm_restart_from_indexes_and_from_a_scan)
{
    mkdir_tmp();
    kvp_disk *d = open_disk(64 * MiB, 2 * MiB, 64 * MiB, 0);
    CHECK(d);
    for (int i = 0; i < 40; i++) { /* 40 x 300 KiB: several pages */
        char key[32];
        snprintf(key, sizeof key, "w%d", i);
        CHECK_EQ(put(d, key, 300 * KiB, (uint64_t)i), 0);
    }
    kvp_disk_close(d); /* clean: every page sealed with its index */
    char idx[600];
    CHECK_EQ(page_file(".idx", 0, idx, sizeof idx), 0);
    d = open_disk(64 * MiB, 2 * MiB, 64 * MiB, 0);
    CHECK(d);
    kvp_disk_stats st;
    kvp_disk_get_stats(d, &st);
    CHECK_EQ(st.records, 40);
    g_each = 0;
    kvp_disk_each(d, count_each, NULL);
    CHECK_EQ(g_each, 40);
    for (int i = 0; i < 40; i++) {
        char key[32];
        snprintf(key, sizeof key, "w%d", i);
        CHECK(holds(d, key, 300 * KiB, (uint64_t)i));
    }
    CHECK_EQ(put(d, "after", 1000, 77), 0); /* appends go to a fresh page */
    kvp_disk_close(d);
    /* without any index file: every page is scanned (values verified) */
    for (int i = 0; page_file(".idx", 0, idx, sizeof idx) == 0 && i < 64; i++)
        unlink(idx);
    d = open_disk(64 * MiB, 2 * MiB, 64 * MiB, 0);
    CHECK(d);
    kvp_disk_get_stats(d, &st);
    CHECK_EQ(st.records, 41);
    CHECK_EQ(st.scan_torn, 0);
    CHECK(holds(d, "after", 1000, 77));
    CHECK(holds(d, "w39", 300 * KiB, 39));
    kvp_disk_close(d);
    rm_tmp();
}

TEST(torn_last_record_and_corrupt_records_are_never_served)
{
    mkdir_tmp();
    kvp_disk *d = open_disk(64 * MiB, 4 * MiB, 64 * MiB, 0);
    CHECK(d);
    for (int i = 0; i < 6; i++) {
        char key[32];
        snprintf(key, sizeof key, "t%d", i);
        CHECK_EQ(put(d, key, 200 * KiB, (uint64_t)i), 0);
    }
    kvp_disk_close(d);
    /* a crash: the open page had no index yet, and its last write tore */
    char page[600], idx[600];
    CHECK_EQ(page_file(".log", 0, page, sizeof page), 0);
    CHECK_EQ(page_file(".idx", 0, idx, sizeof idx), 0);
    unlink(idx);
    uint64_t rec = 4096 + 200 * KiB + 4096 - (200 * KiB) % 4096;
    (void)rec;
    struct stat sb;
    CHECK_EQ(stat(page, &sb), 0);
    /* record 5 starts at 4096 + 5 * (4096 + 204800): damage its value */
    off_t r5 = 4096 + 5 * (off_t)(4096 + 204800);
    flip_byte(page, r5 + 4096 + 1000);
    d = open_disk(64 * MiB, 4 * MiB, 64 * MiB, 0);
    CHECK(d);
    kvp_disk_stats st;
    kvp_disk_get_stats(d, &st);
    CHECK_EQ(st.scan_torn, 1);
    CHECK_EQ(st.records, 5);
    uint8_t buf[16];
    CHECK_EQ(kvp_disk_read(d, T, K("t5"), buf, sizeof buf, NULL), KVP_EOBJECT_NOT_FOUND);
    for (int i = 0; i < 5; i++) {
        char key[32];
        snprintf(key, sizeof key, "t%d", i);
        CHECK(holds(d, key, 200 * KiB, (uint64_t)i));
    }
    for (int i = 6; i < 10; i++) { /* a second page, sealed with its index */
        char key[32];
        snprintf(key, sizeof key, "t%d", i);
        CHECK_EQ(put(d, key, 200 * KiB, (uint64_t)i), 0);
    }
    kvp_disk_close(d);
    /* bit rot in a sealed page (its index intact): caught on read, dropped, reported */
    CHECK_EQ(page_file(".log", 1, page, sizeof page), 0);
    CHECK_EQ(page_file(".idx", 0, idx, sizeof idx), 0);
    off_t r1 = 4096 + 1 * (off_t)(4096 + 204800); /* t7 */
    flip_byte(page, r1 + 4096 + 7);
    d = open_disk(64 * MiB, 4 * MiB, 64 * MiB, 0);
    CHECK(d);
    uint8_t *big = malloc(300 * KiB);
    int64_t r7 = kvp_disk_read(d, T, K("t7"), big, 300 * KiB, NULL);
    int64_t r7b = kvp_disk_read(d, T, K("t7"), big, 300 * KiB, NULL);
    free(big);
    CHECK_EQ(r7, KVP_ECHECKSUM_MISMATCH);
    CHECK_EQ(g_cb.dropped, 1);
    CHECK(!strcmp(g_cb.dropped_keys[0], "t7"));
    CHECK_EQ(r7b, KVP_EOBJECT_NOT_FOUND);
    CHECK(holds(d, "t6", 200 * KiB, 6));
    CHECK(holds(d, "t8", 200 * KiB, 8));
    CHECK(holds(d, "t3", 200 * KiB, 3));
    kvp_disk_get_stats(d, &st);
    CHECK_EQ(st.corrupt, 1);
    kvp_disk_close(d);
    rm_tmp();
}

TEST(removes_survive_restarts)
{
    mkdir_tmp();
    kvp_disk *d = open_disk(32 * MiB, 2 * MiB, 32 * MiB, 0);
    CHECK(d);
    CHECK_EQ(put(d, "a", 5000, 1), 0);
    CHECK_EQ(put(d, "b", 5000, 2), 0);
    kvp_disk_flush(d);
    CHECK_EQ(kvp_disk_remove(d, T, K("a")), 0);
    CHECK_EQ(kvp_disk_remove(d, T, K("a")), KVP_EOBJECT_NOT_FOUND);
    uint8_t buf[8];
    CHECK_EQ(kvp_disk_read(d, T, K("a"), buf, sizeof buf, NULL), KVP_EOBJECT_NOT_FOUND);
    CHECK_EQ(put(d, "b", 7000, 3), 0); /* a newer value replaces the older */
    kvp_disk_close(d);
    d = open_disk(32 * MiB, 2 * MiB, 32 * MiB, 0);
    CHECK(d);
    CHECK_EQ(kvp_disk_read(d, T, K("a"), buf, sizeof buf, NULL), KVP_EOBJECT_NOT_FOUND);
    CHECK(holds(d, "b", 7000, 3));
    kvp_disk_close(d);
    rm_tmp();
}

TEST(capacity_drops_least_recently_used_pages)
{
    mkdir_tmp();
    kvp_disk *d = open_disk(8 * MiB, 1 * MiB, 16 * MiB, 0);
    CHECK(d);
    for (int i = 0; i < 60; i++) { /* 60 x ~260 KiB = ~15 MiB into 8 MiB */
        char key[32];
        snprintf(key, sizeof key, "c%02d", i);
        CHECK_EQ(put(d, key, 256 * KiB, (uint64_t)i), 0);
        kvp_disk_flush(d);
        if (i % 5 == 0) /* c00 read again and again: its page stays recent */
            CHECK(holds(d, "c00", 256 * KiB, 0));
    }
    kvp_disk_stats st;
    kvp_disk_get_stats(d, &st);
    CHECK(st.used <= 8 * MiB);
    CHECK(st.dropped_pages > 0);
    CHECK_EQ((uint64_t)g_cb.dropped, st.dropped_records);
    CHECK_EQ(st.records + st.dropped_records, 60);
    CHECK(holds(d, "c59", 256 * KiB, 59)); /* the newest are kept */
    CHECK(holds(d, "c00", 256 * KiB, 0));  /* and the one read recently */
    uint8_t buf[8];
    CHECK_EQ(kvp_disk_read(d, T, K("c05"), buf, sizeof buf, NULL), KVP_EOBJECT_NOT_FOUND);
    kvp_disk_close(d);
    rm_tmp();
}

TEST(staging_full_answers_200_then_recovers)
{
    mkdir_tmp();
    kvp_disk *d = open_disk(256 * MiB, 16 * MiB, 4 * MiB, 0);
    CHECK(d);
    int refused = 0, ok = 0;
    kvp_disk_pause(d, 1); /* the writer falls behind */
    for (int i = 0; i < 64; i++) {
        char key[32];
        snprintf(key, sizeof key, "p%d", i);
        int rc = put(d, key, MiB, (uint64_t)i);
        if (rc == KVP_ENO_AVAILABLE_HANDLE)
            refused++;
        else if (rc == 0)
            ok++;
    }
    CHECK(refused > 0 && ok >= 2);
    kvp_disk_pause(d, 0);
    kvp_disk_flush(d);
    CHECK_EQ(put(d, "later", MiB, 9), 0); /* drained: accepted again */
    kvp_disk_flush(d);
    CHECK(holds(d, "later", MiB, 9));
    kvp_disk_stats st;
    kvp_disk_get_stats(d, &st);
    CHECK_EQ(st.pressure, (uint64_t)refused);
    CHECK_EQ(g_cb.durable_ok, ok + 1);
    kvp_disk_close(d);
    rm_tmp();
}

TEST(full_disk_answers_200_then_recovers)
{
    mkdir_tmp();
    if (mount("tmpfs", g_dir, "tmpfs", 0, "size=6m") != 0) {
        rm_tmp();
        SKIP("cannot mount a small tmpfs here (needs CAP_SYS_ADMIN)");
    }
    /* capacity claims 64 MiB; the filesystem holds 6 */
    kvp_disk_opts o = {.dir = g_dir, .capacity = 64 * MiB, .page_size = 1 * MiB,
                       .staging_budget = 8 * MiB, .direct = -1, .on_durable = on_durable,
                       .on_dropped = on_dropped, .arg = &g_cb};
    kvp_disk *d = NULL;
    char err[256];
    CHECK_EQ(kvp_disk_open(&o, &d, err, sizeof err), 0);
    char filler[600];
    snprintf(filler, sizeof filler, "%s/filler", g_dir);
    int fd = open(filler, O_WRONLY | O_CREAT, 0600);
    CHECK(fd >= 0);
    CHECK_EQ(posix_fallocate(fd, 0, 4 * MiB), 0); /* leave ~2 MiB */
    close(fd);
    int refused = 0;
    for (int i = 0; i < 12; i++) {
        char key[32];
        snprintf(key, sizeof key, "f%d", i);
        int rc = put(d, key, 400 * KiB, (uint64_t)i);
        refused += rc == KVP_ENO_AVAILABLE_HANDLE;
        kvp_disk_flush(d);
    }
    CHECK(refused > 0 || g_cb.durable_err > 0);
    if (g_cb.durable_err)
        CHECK_EQ(g_cb.last_err, KVP_ENO_AVAILABLE_HANDLE);
    unlink(filler); /* space returns */
    usleep(600 * 1000);
    CHECK_EQ(put(d, "back", 400 * KiB, 5), 0);
    kvp_disk_flush(d);
    CHECK(holds(d, "back", 400 * KiB, 5));
    kvp_disk_close(d);
    umount(g_dir);
    rm_tmp();
}

TEST(compaction_reclaims_mostly_dead_pages)
{
    mkdir_tmp();
    kvp_disk *d = open_disk(64 * MiB, 1 * MiB, 32 * MiB, 0);
    CHECK(d);
    for (int i = 0; i < 24; i++) { /* 24 x 200 KiB: ~5 pages */
        char key[32];
        snprintf(key, sizeof key, "m%02d", i);
        CHECK_EQ(put(d, key, 200 * KiB, (uint64_t)i), 0);
    }
    kvp_disk_flush(d);
    for (int i = 0; i < 24; i++)
        if (i % 4) { /* three of four die */
            char key[32];
            snprintf(key, sizeof key, "m%02d", i);
            CHECK_EQ(kvp_disk_remove(d, T, K(key)), 0);
        }
    kvp_disk_flush(d);
    kvp_disk_stats st0, st;
    kvp_disk_get_stats(d, &st0);
    for (int r = 0; r < 20; r++) {
        kvp_disk_tick(d, 512 * KiB);
        kvp_disk_flush(d);
    }
    kvp_disk_get_stats(d, &st);
    CHECK(st.compacted_pages > 0);
    CHECK(st.pages < st0.pages);
    for (int i = 0; i < 24; i += 4) {
        char key[32];
        snprintf(key, sizeof key, "m%02d", i);
        CHECK(holds(d, key, 200 * KiB, (uint64_t)i));
    }
    kvp_disk_close(d);
    d = open_disk(64 * MiB, 1 * MiB, 32 * MiB, 0); /* and after a restart */
    CHECK(d);
    kvp_disk_get_stats(d, &st);
    CHECK_EQ(st.records, 6);
    uint8_t buf[8];
    CHECK_EQ(kvp_disk_read(d, T, K("m01"), buf, sizeof buf, NULL), KVP_EOBJECT_NOT_FOUND);
    CHECK(holds(d, "m20", 200 * KiB, 20));
    kvp_disk_close(d);
    rm_tmp();
}

TEST(bad_options_are_named)
{
    mkdir_tmp();
    kvp_disk_opts o = {.dir = g_dir, .capacity = 1 * MiB, .page_size = 1 * MiB};
    kvp_disk *d = NULL;
    char err[256];
    CHECK_EQ(kvp_disk_open(&o, &d, err, sizeof err), KVP_ECONFIG);
    CHECK(strstr(err, "offload_capacity"));
    o.capacity = 64 * MiB;
    o.page_size = 1000;
    CHECK_EQ(kvp_disk_open(&o, &d, err, sizeof err), KVP_ECONFIG);
    CHECK(strstr(err, "page size"));
    o.page_size = 1 * MiB;
    o.low_watermark = 0.9;
    o.high_watermark = 0.8;
    CHECK_EQ(kvp_disk_open(&o, &d, err, sizeof err), KVP_ECONFIG);
    CHECK(strstr(err, "watermarks"));
    o.dir = "";
    CHECK_EQ(kvp_disk_open(&o, &d, err, sizeof err), KVP_ECONFIG);
    rm_tmp();
}

TEST(header_codec_refuses_damage)
{
    uint8_t b[8192];
    kvp_disk_hdr h = {0, 3, 7, 12345, 0xfeed, 42, (const uint8_t *)"key", (const uint8_t *)"default", 0, 0};
    size_t hl = kvp_disk_hdr_encode(b, &h);
    CHECK_EQ(hl, 48 + 3 + 7);
    kvp_disk_hdr g;
    CHECK_EQ(kvp_disk_hdr_parse(b, hl, &g), 0);
    CHECK_EQ(g.size, 12345);
    CHECK_EQ(g.seq, 42);
    CHECK_EQ(g.total, 16384); /* header and value share blocks */
    CHECK(!memcmp(g.key, "key", 3) && !memcmp(g.tenant, "default", 7));
    for (size_t i = 0; i < 58; i++) { /* any flipped header byte is refused */
        b[i] ^= 1;
        CHECK_EQ(kvp_disk_hdr_parse(b, hl, &g), -1);
        b[i] ^= 1;
    }
    CHECK_EQ(kvp_disk_hdr_parse(b, 40, &g), -1);
}

/* ---------------------------------------------------------- threads */

typedef struct targ {
    kvp_disk *d;
    int id, bad;
} targ;

static void *worker(void *p)
{
    targ *a = p;
    for (int i = 0; i < 60; i++) {
        char key[32];
        snprintf(key, sizeof key, "x%d-%d", a->id, i);
        size_t n = 20 * KiB + (size_t)(i * 997 % 50000);
        int rc = put(a->d, key, n, (uint64_t)(a->id * 1000 + i));
        if (rc && rc != KVP_ENO_AVAILABLE_HANDLE)
            a->bad++;
        if (i % 3 == 0) {
            kvp_disk_flush(a->d);
            if (rc == 0 && !holds(a->d, key, n, (uint64_t)(a->id * 1000 + i))) {
                /* dropped for room is fine; wrong bytes are not */
                uint8_t *g = malloc(n);
                int64_t r = kvp_disk_read(a->d, T, K(key), g, n, NULL);
                if (r != KVP_EOBJECT_NOT_FOUND)
                    a->bad++;
                free(g);
            }
        }
        if (i % 5 == 4) {
            snprintf(key, sizeof key, "x%d-%d", a->id, i - 2);
            kvp_disk_remove(a->d, T, K(key));
        }
        if (a->id == 0)
            kvp_disk_tick(a->d, 256 * KiB);
    }
    return NULL;
}

TEST(concurrent_writes_reads_removes_and_compaction)
{
    mkdir_tmp();
    kvp_disk *d = open_disk(12 * MiB, 1 * MiB, 8 * MiB, 0);
    CHECK(d);
    targ a[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (targ){d, i, 0};
        pthread_create(&th[i], NULL, worker, &a[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ(a[i].bad, 0);
    }
    kvp_disk_close(d);
    d = open_disk(12 * MiB, 1 * MiB, 8 * MiB, 0);
    CHECK(d);
    kvp_disk_close(d);
    rm_tmp();
}

/* Writes of one key, queued back to back (sizes vary, pages roll under
 * them), complete in queue order: the last one is what reads and restarts
 * see; close waits for every queued write and runs its callback. */
static void queue_order_body(int io)
{
    mkdir_tmp();
    kvp_disk *d = open_disk(64 * MiB, 1 * MiB, 64 * MiB, io);
    CHECK(d);
    int n = 0;
    for (int i = 0; i < 120; i++) {
        size_t sz = 20 * KiB + (size_t)(i * 7919 % 300) * KiB;
        CHECK_EQ(put(d, "same", sz, 500 + (uint64_t)i), 0);
        char key[32];
        snprintf(key, sizeof key, "o%d", i);
        CHECK_EQ(put(d, key, 5000, (uint64_t)i), 0);
        n += 2;
    }
    size_t last = 20 * KiB + (size_t)(119 * 7919 % 300) * KiB;
    kvp_disk_flush(d);
    CHECK_EQ(g_cb.durable_ok, n);
    CHECK(holds(d, "same", last, 619));
    for (int i = 0; i < 40; i++) /* and without a flush before the close */
        CHECK_EQ(put(d, "same", 1000 + (size_t)i, 700 + (uint64_t)i), 0);
    kvp_disk_close(d);
    CHECK_EQ(g_cb.durable_ok, n + 40);
    CHECK_EQ(g_cb.durable_err, 0);
    d = open_disk(64 * MiB, 1 * MiB, 64 * MiB, io);
    CHECK(d);
    CHECK(holds(d, "same", 1039, 739));
    CHECK(holds(d, "o77", 5000, 77));
    kvp_disk_stats st;
    kvp_disk_get_stats(d, &st);
    CHECK_EQ(st.records, 121);
    kvp_disk_close(d);
    rm_tmp();
}

TEST(writes_of_a_key_complete_in_queue_order_io_uring) { queue_order_body(KVP_DISK_IO_AUTO); }
TEST(writes_of_a_key_complete_in_queue_order_pwrite) { queue_order_body(KVP_DISK_IO_PWRITE); }

/* ------------------------------------------- resurrection after drops */

/* Writes filler records (256 KiB, flushed one by one) until page drops
 * have happened `drops` more times, reading `hot` after each so that its
 * page stays the most recently used. */
static void fill_until_drops(kvp_disk *d, const char *hot, uint64_t hot_seed, uint64_t drops)
{
    kvp_disk_stats st;
    kvp_disk_get_stats(d, &st);
    uint64_t want = st.dropped_pages + drops;
    for (int i = 0; i < 200 && st.dropped_pages < want; i++) {
        char key[32];
        snprintf(key, sizeof key, "fill%03d", i);
        CHECK_EQ(put(d, key, 256 * KiB, 1000 + (uint64_t)i), 0);
        kvp_disk_flush(d);
        CHECK(holds(d, hot, 256 * KiB, hot_seed));
        kvp_disk_get_stats(d, &st);
    }
    CHECK(st.dropped_pages >= want);
}

/* A removed key stays removed across a restart when the page holding its
 * tombstone is dropped for room while an older page holding the record
 * survives (here: kept recent by reads of another record in it). */
TEST(a_removed_key_stays_removed_when_its_tombstone_page_is_dropped)
{
    mkdir_tmp();
    kvp_disk *d = open_disk(8 * MiB, 1 * MiB, 16 * MiB, 0);
    CHECK(d);
    /* page A: gone, hot, a0 (three 256 KiB records fill a 1 MiB page) */
    CHECK_EQ(put(d, "gone", 256 * KiB, 1), 0);
    CHECK_EQ(put(d, "hot", 256 * KiB, 2), 0);
    CHECK_EQ(put(d, "a0", 256 * KiB, 3), 0);
    CHECK_EQ(put(d, "b0", 256 * KiB, 4), 0); /* page B */
    kvp_disk_flush(d);
    CHECK_EQ(kvp_disk_remove(d, T, K("gone")), 0); /* its tombstone goes to page B */
    kvp_disk_flush(d);
    fill_until_drops(d, "hot", 2, 4); /* B is dropped; A survives */
    uint8_t buf[8];
    CHECK_EQ(kvp_disk_read(d, T, K("b0"), buf, sizeof buf, NULL), KVP_EOBJECT_NOT_FOUND);
    CHECK(holds(d, "hot", 256 * KiB, 2));
    CHECK_EQ(kvp_disk_read(d, T, K("gone"), buf, sizeof buf, NULL), KVP_EOBJECT_NOT_FOUND);
    kvp_disk_close(d);
    d = open_disk(8 * MiB, 1 * MiB, 16 * MiB, 0);
    CHECK(d);
    CHECK(holds(d, "hot", 256 * KiB, 2));
    CHECK_EQ(kvp_disk_read(d, T, K("gone"), buf, sizeof buf, NULL), KVP_EOBJECT_NOT_FOUND);
    kvp_disk_close(d);
    rm_tmp();
}

/* Likewise an older value of a key does not come back after a restart once
 * the newer value's page was dropped (the newer one reported dropped); here
 * the key is also removed and written again in between, and the tombstone's
 * page compacted away. */
TEST(an_older_value_does_not_come_back_when_the_newer_page_is_dropped)
{
    mkdir_tmp();
    kvp_disk *d = open_disk(8 * MiB, 1 * MiB, 16 * MiB, 0);
    CHECK(d);
    CHECK_EQ(put(d, "k", 256 * KiB, 1), 0); /* page A: k v1, hot, a0 */
    CHECK_EQ(put(d, "hot", 256 * KiB, 2), 0);
    CHECK_EQ(put(d, "a0", 256 * KiB, 3), 0);
    CHECK_EQ(put(d, "b0", 256 * KiB, 4), 0); /* page B: b0, the tombstone of k */
    kvp_disk_flush(d);
    CHECK_EQ(kvp_disk_remove(d, T, K("k")), 0);
    kvp_disk_flush(d);
    CHECK_EQ(put(d, "k", 256 * KiB, 5), 0);  /* k v2, in B too */
    CHECK_EQ(put(d, "b1", 256 * KiB, 6), 0); /* page C */
    kvp_disk_flush(d);
    CHECK(holds(d, "k", 256 * KiB, 5));
    CHECK_EQ(put(d, "k", 256 * KiB, 7), 0); /* k v3, in C */
    kvp_disk_flush(d);
    CHECK_EQ(kvp_disk_remove(d, T, K("b0")), 0); /* B is all dead: compacted away */
    kvp_disk_flush(d);
    kvp_disk_stats st;
    for (int r = 0; r < 10; r++) {
        kvp_disk_tick(d, 4 * MiB);
        kvp_disk_flush(d);
    }
    kvp_disk_get_stats(d, &st);
    CHECK(st.compacted_pages >= 1);
    CHECK(holds(d, "k", 256 * KiB, 7));
    fill_until_drops(d, "hot", 2, 4); /* C (k v3) is dropped; A (k v1) survives */
    uint8_t buf[8];
    CHECK_EQ(kvp_disk_read(d, T, K("k"), buf, sizeof buf, NULL), KVP_EOBJECT_NOT_FOUND);
    int reported = 0;
    for (int i = 0; i < g_cb.dropped && i < 64; i++)
        reported += !strcmp(g_cb.dropped_keys[i], "k");
    CHECK_EQ(reported, 1);
    kvp_disk_close(d);
    d = open_disk(8 * MiB, 1 * MiB, 16 * MiB, 0);
    CHECK(d);
    CHECK(holds(d, "hot", 256 * KiB, 2));
    CHECK_EQ(kvp_disk_read(d, T, K("k"), buf, sizeof buf, NULL), KVP_EOBJECT_NOT_FOUND);
    kvp_disk_close(d);
    rm_tmp();
}

/* A record dropped for a failed checksum stays dropped after a restart,
 * and does not let an older value of its key come back either, once its
 * own page is dropped too. */
TEST(an_older_value_does_not_come_back_after_a_checksum_drop)
{
    mkdir_tmp();
    kvp_disk *d = open_disk(8 * MiB, 1 * MiB, 16 * MiB, 0);
    CHECK(d);
    CHECK_EQ(put(d, "k", 256 * KiB, 1), 0); /* page A: k v1, hot, a0 */
    CHECK_EQ(put(d, "hot", 256 * KiB, 2), 0);
    CHECK_EQ(put(d, "a0", 256 * KiB, 3), 0);
    CHECK_EQ(put(d, "k", 256 * KiB, 4), 0); /* page B: k v2 first */
    kvp_disk_close(d);
    char page[600];
    CHECK_EQ(page_file(".log", 1, page, sizeof page), 0);
    flip_byte(page, 4096 + 4096 + 100); /* k v2's value */
    d = open_disk(8 * MiB, 1 * MiB, 16 * MiB, 0);
    CHECK(d);
    uint8_t *buf = malloc(256 * KiB);
    CHECK_EQ(kvp_disk_read(d, T, K("k"), buf, 256 * KiB, NULL), KVP_ECHECKSUM_MISMATCH);
    free(buf);
    CHECK_EQ(g_cb.dropped, 1);
    uint8_t small[8];
    kvp_disk_close(d); /* reported dropped: not back after a restart either */
    d = open_disk(8 * MiB, 1 * MiB, 16 * MiB, 0);
    CHECK(d);
    CHECK_EQ(kvp_disk_read(d, T, K("k"), small, sizeof small, NULL), KVP_EOBJECT_NOT_FOUND);
    fill_until_drops(d, "hot", 2, 4); /* B is dropped; A survives */
    CHECK_EQ(kvp_disk_read(d, T, K("k"), small, sizeof small, NULL), KVP_EOBJECT_NOT_FOUND);
    kvp_disk_close(d);
    d = open_disk(8 * MiB, 1 * MiB, 16 * MiB, 0);
    CHECK(d);
    CHECK(holds(d, "hot", 256 * KiB, 2));
    CHECK_EQ(kvp_disk_read(d, T, K("k"), small, sizeof small, NULL), KVP_EOBJECT_NOT_FOUND);
    kvp_disk_close(d);
    rm_tmp();
}

/* ------------------------------------------- forgetting one record */

struct seq_find {
    const char *key;
    uint64_t seq;
};

static void seq_one(void *arg, const kvp_disk_rec *r)
{
    struct seq_find *f = arg;
    if (r->key_len == strlen(f->key) && !memcmp(r->key, f->key, r->key_len))
        f->seq = r->seq;
}

/* The sequence of key's live record, 0 if none. */
static uint64_t seq_of(kvp_disk *d, const char *key)
{
    struct seq_find f = {key, 0};
    kvp_disk_each(d, seq_one, &f);
    return f.seq;
}

static uint64_t csum_of(size_t n, uint64_t seed)
{
    uint8_t *v = malloc(n);
    tp_fill(v, n, seed);
    uint64_t c = XXH3_64bits(v, n);
    free(v);
    return c;
}

/* A FORGET of an older record of a key (queued before the key was written
 * again) leaves the newer record alone, also across a restart's rescan,
 * while one naming the live record removes it for good. */
TEST(forget_removes_only_the_record_it_names)
{
    mkdir_tmp();
    kvp_disk *d = open_disk(32 * MiB, 2 * MiB, 32 * MiB, 0);
    CHECK(d);
    CHECK_EQ(put(d, "k", 5000, 1), 0);
    kvp_disk_flush(d);
    uint64_t s1 = seq_of(d, "k");
    CHECK(s1 != 0);
    CHECK_EQ(put(d, "k", 6000, 2), 0); /* the key spilled again: a newer record */
    kvp_disk_flush(d);
    uint64_t s2 = seq_of(d, "k");
    CHECK(s2 > s1);
    /* stale: the first record's id; or the live id with another value */
    CHECK_EQ(kvp_disk_forget(d, T, K("k"), kvp_disk_rec_id(s1), 5000, csum_of(5000, 1)), 1);
    CHECK_EQ(kvp_disk_forget(d, T, K("k"), kvp_disk_rec_id(s2), 6000, csum_of(6000, 1)), 1);
    CHECK_EQ(kvp_disk_forget(d, T, K("k"), kvp_disk_rec_id(s2), 5000, csum_of(6000, 2)), 1);
    CHECK(holds(d, "k", 6000, 2));
    kvp_disk_close(d);
    /* the rescan finds the same record under the same sequence */
    d = open_disk(32 * MiB, 2 * MiB, 32 * MiB, 0);
    CHECK(d);
    CHECK(holds(d, "k", 6000, 2));
    CHECK_EQ(seq_of(d, "k"), s2);
    CHECK_EQ(kvp_disk_forget(d, T, K("k"), kvp_disk_rec_id(s1), 5000, csum_of(5000, 1)), 1);
    CHECK(holds(d, "k", 6000, 2));
    /* the live record named: removed; a second FORGET finds nothing */
    CHECK_EQ(kvp_disk_forget(d, T, K("k"), kvp_disk_rec_id(s2), 6000, csum_of(6000, 2)), 0);
    uint8_t buf[8];
    CHECK_EQ(kvp_disk_read(d, T, K("k"), buf, sizeof buf, NULL), KVP_EOBJECT_NOT_FOUND);
    CHECK_EQ(kvp_disk_forget(d, T, K("k"), kvp_disk_rec_id(s2), 6000, csum_of(6000, 2)),
             KVP_EOBJECT_NOT_FOUND);
    kvp_disk_close(d);
    /* neither record comes back after a restart (the older one is a ghost) */
    d = open_disk(32 * MiB, 2 * MiB, 32 * MiB, 0);
    CHECK(d);
    CHECK_EQ(kvp_disk_read(d, T, K("k"), buf, sizeof buf, NULL), KVP_EOBJECT_NOT_FOUND);
    CHECK_EQ(seq_of(d, "k"), 0);
    /* and every record written after the restart is numbered above them */
    CHECK_EQ(put(d, "k2", 4096, 3), 0);
    kvp_disk_flush(d);
    CHECK(seq_of(d, "k2") > s2);
    kvp_disk_close(d);
    rm_tmp();
}

/* A FORGET of the live record while a newer write of the key is queued
 * (not yet durable) removes that record only: the newer one is indexed
 * when durable and survives restarts. (A remove of the key would take the
 * queued write with it.) */
static void forget_queued_body(int io)
{
    mkdir_tmp();
    kvp_disk *d = open_disk(32 * MiB, 2 * MiB, 32 * MiB, io);
    CHECK(d);
    CHECK_EQ(put(d, "k", 5000, 1), 0);
    kvp_disk_flush(d);
    uint64_t s1 = seq_of(d, "k");
    kvp_disk_pause(d, 1);
    CHECK_EQ(put(d, "k", 7000, 2), 0);
    CHECK_EQ(kvp_disk_forget(d, T, K("k"), kvp_disk_rec_id(s1), 5000, csum_of(5000, 1)), 0);
    uint8_t buf[8];
    CHECK_EQ(kvp_disk_read(d, T, K("k"), buf, sizeof buf, NULL), KVP_EOBJECT_NOT_FOUND);
    kvp_disk_pause(d, 0);
    kvp_disk_flush(d);
    CHECK(holds(d, "k", 7000, 2));
    CHECK(seq_of(d, "k") > s1);
    kvp_disk_close(d);
    d = open_disk(32 * MiB, 2 * MiB, 32 * MiB, io);
    CHECK(d);
    CHECK(holds(d, "k", 7000, 2));
    kvp_disk_close(d);
    rm_tmp();
}

TEST(forget_spares_a_newer_write_still_queued_io_uring) { forget_queued_body(KVP_DISK_IO_AUTO); }
TEST(forget_spares_a_newer_write_still_queued_pwrite) { forget_queued_body(KVP_DISK_IO_PWRITE); }
