/*
 * test_disk_tier.c -- the SSD tier end to end, real processes on 127.0.0.1:
 * a master and a `kvpool store --enable-offload` whose DRAM segment is much
 * smaller than what is put. Objects evicted from DRAM are spilled and come
 * back byte-exact; the node killed with -9 and restarted on the same
 * directory serves them again; a restarted master gets them re-registered;
 * a corrupted record is reported missing, never served.
 */
#include <dirent.h>
#include <pthread.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "kvpool.h"
#include "proc.h"

#define MiB (1024ull * 1024)
#define VAL (1 * MiB)
#define NKEYS 48 /* 48 MiB put into a 16 MiB segment */

typedef struct env {
    tp_master m;
    tp_store st;
    char dir[256];
    char addr[64];
} env;

static int store_start(env *e)
{
    const char *extra[] = {"--segment-size", "16MiB", "--enable-offload", "--offload-dir",
                           e->dir, "--offload-capacity", "256MiB", "--offload-page-size",
                           "64MiB", NULL};
    return tp_store_start(&e->st, e->addr, extra);
}

static int master_start(env *e, int fixed)
{
    const char *extra[] = {"--client-ttl", "2s", "--lease-ttl", "1s", "--put-timeout", "5s",
                           fixed ? "--listen" : NULL, e->addr, NULL};
    if (tp_master_start(&e->m, extra) != 0)
        return -1;
    snprintf(e->addr, sizeof e->addr, "%s", e->m.addr);
    return 0;
}

static int env_start(env *e)
{
    memset(e, 0, sizeof *e);
    snprintf(e->dir, sizeof e->dir, "/tmp/kvpool-disk-tier-XXXXXX");
    if (!mkdtemp(e->dir))
        return -1;
    if (master_start(e, 0) != 0)
        return -1;
    return store_start(e);
}

static void env_stop(env *e)
{
    if (e->st.pid)
        tp_store_stop(&e->st);
    if (e->m.pid)
        tp_master_stop(&e->m);
    tp_rm_dir(e->dir);
}

static kvp_client *client_open(const char *addr)
{
    char cfg[512], err[512];
    snprintf(cfg, sizeof cfg,
             "{\"master\": \"%s\", \"mode\": \"standalone-store\", \"rpc_timeout\": \"10s\"}",
             addr);
    kvp_client *c = NULL;
    if (kvp_client_open(cfg, &c, err, sizeof err) != 0) {
        fprintf(stderr, "    kvp_client_open: %s\n", err);
        return NULL;
    }
    return c;
}

/* A master counter from `stat` (JSON), -1 if it cannot be read. */
static long long counter(kvp_client *c, const char *name)
{
    char buf[16384], pat[80];
    if (kvp_client_stat(c, buf, sizeof buf) < 0)
        return -1;
    snprintf(pat, sizeof pat, "\"%s\": ", name);
    const char *p = strstr(buf, pat);
    return p ? atoll(p + strlen(pat)) : -1;
}

static void key_name(char *k, size_t n, int i) { snprintf(k, n, "tier-key-%04d", i); }

/* Puts keys [from, to), as put_all. */
static int put_range(kvp_client *c, int from, int to);

/* Puts keys [0, n): a -200 (the tier is still writing the room out) is
 * retried, as the connector's back-off would. */
static int put_all(kvp_client *c, int n) { return put_range(c, 0, n); }

static int put_range(kvp_client *c, int from, int to)
{
    uint8_t *v = malloc(VAL);
    int rc = 0;
    for (int i = from; i < to && rc == 0; i++) {
        char k[32];
        key_name(k, sizeof k, i);
        tp_fill(v, VAL, (uint64_t)i);
        uint64_t end = tp_now_ms() + 20000;
        while ((rc = kvp_client_put(c, k, v, VAL)) == KVP_ENO_AVAILABLE_HANDLE &&
               tp_now_ms() < end)
            tp_sleep_ms(5);
        if (rc)
            fprintf(stderr, "    put %s: %s\n", k, kvp_strerror(rc));
    }
    free(v);
    return rc;
}

/* Reads keys [from, to): each is byte-exact or (when missing_ok) not found.
 * Returns how many were found, -1 on a wrong byte or another error. */
static int get_range(kvp_client *c, int from, int to, int missing_ok)
{
    uint8_t *v = malloc(VAL), *want = malloc(VAL);
    int found = 0;
    for (int i = from; i < to; i++) {
        char k[32];
        key_name(k, sizeof k, i);
        memset(v, 0xEE, VAL);
        int64_t r = kvp_client_get(c, k, v, VAL);
        if (r == KVP_EOBJECT_NOT_FOUND && missing_ok)
            continue;
        tp_fill(want, VAL, (uint64_t)i);
        if (r != (int64_t)VAL || memcmp(v, want, VAL) != 0) {
            fprintf(stderr, "    get %s: %s\n", k,
                    r < 0 ? kvp_strerror((int)r) : "wrong bytes");
            found = -1;
            break;
        }
        found++;
    }
    free(v);
    free(want);
    return found;
}

static int get_all(kvp_client *c, int n, int missing_ok) { return get_range(c, 0, n, missing_ok); }

static int wait_segments(const char *addr, int want, unsigned ms)
{
    uint64_t end = tp_now_ms() + ms;
    while (tp_now_ms() < end) {
        if (tp_master_segments(addr) == want)
            return 0;
        tp_sleep_ms(50);
    }
    return -1;
}

TEST(spilled_objects_come_back_byte_exact)
{
    env e;
    CHECK(env_start(&e) == 0);
    kvp_client *c = client_open(e.addr);
    CHECK(c != NULL);
    CHECK_EQ(put_all(c, NKEYS), 0);
    /* three times the segment was put: the oldest were spilled, none lost */
    CHECK(counter(c, "spills") >= NKEYS - 16);
    CHECK_EQ(counter(c, "evictions"), 0);
    CHECK_EQ(counter(c, "objects"), NKEYS);
    CHECK(counter(c, "disk_objects") >= NKEYS - 16);
    CHECK_EQ(get_all(c, NKEYS, 0), NKEYS);
    CHECK(counter(c, "disk_hits") > 0);
    CHECK(counter(c, "loads") > 0);
    CHECK_EQ(counter(c, "load_fails"), 0);
    /* the node's own figures reach `stat` (page files in use) */
    uint64_t until = tp_now_ms() + 3000;
    while (counter(c, "disk_used") <= 0 && tp_now_ms() < until)
        tp_sleep_ms(20);
    CHECK(counter(c, "disk_used") >= 64 << 20);
    /* the tier in a description */
    char d[2048];
    char k[32];
    key_name(k, sizeof k, 0);
    CHECK(kvp_client_describe_json(c, k, d, sizeof d) > 0);
    CHECK(strstr(d, "\"tier\": ") != NULL);
    /* a removed object is gone from disk too: not back after a restart */
    CHECK_EQ(kvp_client_remove(c, k, 1), 0);
    kvp_client_close(c);
    CHECK_EQ(tp_store_stop(&e.st), 0);
    CHECK(wait_segments(e.addr, 0, 10000) == 0);
    CHECK(store_start(&e) == 0);
    c = client_open(e.addr);
    CHECK(c != NULL);
    uint64_t end = tp_now_ms() + 5000;
    while (counter(c, "objects") < NKEYS - 17 && tp_now_ms() < end)
        tp_sleep_ms(20);
    CHECK_EQ(kvp_client_get(c, k, NULL, 0), KVP_EOBJECT_NOT_FOUND);
    int found = get_all(c, NKEYS, 1);
    CHECK(found >= NKEYS - 17); /* those on disk at the stop; DRAM went with it */
    kvp_client_close(c);
    env_stop(&e);
}

/* A pool holding NKEYS values, most of them spilled: how many are on disk
 * (-1 on failure). */
static long long filled(env *e)
{
    if (env_start(e) != 0)
        return -1;
    kvp_client *c = client_open(e->addr);
    if (!c)
        return -1;
    long long on_disk = put_all(c, NKEYS) == 0 ? counter(c, "disk_objects") : -1;
    kvp_client_close(c);
    return on_disk;
}

TEST(node_kill9_and_master_restart_keep_disk_objects)
{
    env e;
    long long on_disk = filled(&e);
    CHECK(on_disk >= NKEYS - 16);
    kvp_client *c;
    /* kill -9: the new node finds the durable records and reports them */
    tp_store_kill(&e.st);
    CHECK(store_start(&e) == 0);
    CHECK(wait_segments(e.addr, 1, 10000) == 0); /* the dead one dropped at its TTL */
    c = client_open(e.addr);
    CHECK(c != NULL);
    uint64_t end = tp_now_ms() + 5000;
    while (counter(c, "disk_objects") < on_disk && tp_now_ms() < end)
        tp_sleep_ms(20);
    CHECK(counter(c, "disk_registered") >= on_disk);
    int found = get_all(c, NKEYS, 1);
    CHECK(found >= on_disk);
    kvp_client_close(c);
    /* the master restarts (same address): the node remounts and registers
     * its records again */
    tp_master_kill(&e.m);
    CHECK(master_start(&e, 1) == 0);
    CHECK(wait_segments(e.addr, 1, 10000) == 0);
    c = client_open(e.addr);
    CHECK(c != NULL);
    end = tp_now_ms() + 5000;
    while (counter(c, "disk_objects") < on_disk && tp_now_ms() < end)
        tp_sleep_ms(20);
    CHECK(counter(c, "disk_objects") >= on_disk);
    found = get_all(c, NKEYS, 1);
    CHECK(found >= on_disk);
    kvp_client_close(c);
    env_stop(&e);
}

/* Flips one byte in the value of every record found in the page files
 * (offset: each 4 KiB-aligned record header "KVPR", value at +4096 for
 * these small keys), up to max records. Returns how many. */
static int corrupt_records(const char *dir, int max)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d)) && n < max) {
        size_t l = strlen(de->d_name);
        if (l < 4 || strcmp(de->d_name + l - 4, ".log"))
            continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        int fd = open(p, O_RDWR);
        if (fd < 0)
            continue;
        struct stat sb;
        fstat(fd, &sb);
        uint8_t hdr[4];
        for (off_t off = 4096; off + 8192 <= sb.st_size && n < max; off += 4096) {
            if (pread(fd, hdr, 4, off) != 4 || memcmp(hdr, "KVPR", 4))
                continue;
            uint8_t b;
            if (pread(fd, &b, 1, off + 4096 + 100) == 1) {
                b ^= 0x5A;
                if (pwrite(fd, &b, 1, off + 4096 + 100) == 1)
                    n++;
            }
            off += VAL; /* past this record's value */
        }
        fsync(fd);
        close(fd);
    }
    closedir(d);
    return n;
}

TEST(corrupt_records_reported_missing_never_served)
{
    env e;
    long long on_disk = filled(&e);
    CHECK(on_disk >= NKEYS - 16);
    kvp_client *c;
    CHECK_EQ(tp_store_stop(&e.st), 0);
    CHECK(wait_segments(e.addr, 0, 10000) == 0);
    int bad = corrupt_records(e.dir, 5);
    CHECK_EQ(bad, 5);
    CHECK(store_start(&e) == 0);
    c = client_open(e.addr);
    CHECK(c != NULL);
    uint64_t end = tp_now_ms() + 5000;
    while (counter(c, "disk_objects") < on_disk && tp_now_ms() < end)
        tp_sleep_ms(20);
    /* (spills that finished after on_disk was read are on disk too) */
    long long reg = counter(c, "disk_objects");
    CHECK(reg >= on_disk);
    /* every key is byte-exact or missing: the corrupt ones are missing */
    int found = get_all(c, NKEYS, 1);
    CHECK(found >= 0);
    CHECK(found + bad <= reg);
    CHECK(counter(c, "load_fails") >= bad);
    CHECK_EQ(counter(c, "disk_objects"), found); /* the corrupt ones are gone */
    kvp_client_close(c);
    env_stop(&e);
}

/* The disk fills up (a small tmpfs, less than offload_capacity claims):
 * spills fail and their victims are dropped as without a tier (puts go on,
 * after -200 back-offs); once space returns, spills succeed again and those
 * objects come back from disk. */
TEST(disk_full_then_space_returns)
{
    env e;
    memset(&e, 0, sizeof e);
    snprintf(e.dir, sizeof e.dir, "/tmp/kvpool-disk-full-XXXXXX");
    CHECK(mkdtemp(e.dir) != NULL);
    if (mount("tmpfs", e.dir, "tmpfs", 0, "size=150m") != 0) {
        rmdir(e.dir);
        SKIP("cannot mount a small tmpfs here (needs CAP_SYS_ADMIN)");
    }
    char filler[300];
    snprintf(filler, sizeof filler, "%s/filler", e.dir);
    int fd = open(filler, O_WRONLY | O_CREAT, 0600);
    CHECK(fd >= 0);
    CHECK_EQ(posix_fallocate(fd, 0, 60 * MiB), 0); /* room for one 64 MiB page, not two */
    close(fd);
    CHECK(master_start(&e, 0) == 0);
    CHECK(store_start(&e) == 0);
    kvp_client *c = client_open(e.addr);
    CHECK(c != NULL);
    CHECK_EQ(put_range(c, 0, 110), 0); /* about 90 MiB to spill: the disk fills */
    CHECK(counter(c, "spill_fails") > 0);
    CHECK(counter(c, "evictions") > 0);
    long long spills = counter(c, "spills");
    CHECK(spills > 0);
    CHECK(get_range(c, 0, 110, 1) >= 0); /* what is there is byte-exact */
    unlink(filler); /* space returns */
    tp_sleep_ms(700);
    CHECK_EQ(put_range(c, 200, 250), 0);
    CHECK(counter(c, "spills") > spills);
    CHECK_EQ(get_range(c, 200, 230, 0), 30); /* spilled after the recovery: all back */
    kvp_client_close(c);
    tp_store_stop(&e.st);
    e.st.pid = 0;
    umount(e.dir);
    env_stop(&e);
}

typedef struct worker_arg {
    const char *addr;
    int from, to, rc;
} worker_arg;

/* One client thread: puts its keys, reads them all back (byte-exact or
 * missing), removes every third, reads again. */
static void *worker_main(void *p)
{
    worker_arg *w = p;
    kvp_client *c = client_open(w->addr);
    if (!c) {
        w->rc = -1;
        return NULL;
    }
    w->rc = put_range(c, w->from, w->to);
    for (int round = 0; round < 2 && w->rc == 0; round++) {
        if (get_range(c, w->from, w->to, 1) < 0)
            w->rc = -2;
        for (int i = w->from + round; i < w->to && w->rc == 0; i += 3) {
            char k[32];
            key_name(k, sizeof k, i);
            int r = kvp_client_remove(c, k, 1);
            if (r != 0 && r != KVP_EOBJECT_NOT_FOUND)
                w->rc = r;
        }
    }
    kvp_client_close(c);
    return NULL;
}

/* Spills, loads, removes (and the compaction they make due) from three
 * clients at once: every value read is byte-exact; the node's threads are
 * checked by TSan under `make tsan`. */
TEST(concurrent_spills_loads_removes)
{
    env e;
    CHECK(env_start(&e) == 0);
    pthread_t th[3];
    worker_arg w[3];
    for (int i = 0; i < 3; i++) {
        w[i] = (worker_arg){e.addr, i * 1000, i * 1000 + 24, 0};
        CHECK(pthread_create(&th[i], NULL, worker_main, &w[i]) == 0);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ(w[i].rc, 0);
    }
    kvp_client *c = client_open(e.addr);
    CHECK(c != NULL);
    CHECK_EQ(counter(c, "load_fails"), 0);
    CHECK(counter(c, "spills") > 0);
    kvp_client_close(c);
    env_stop(&e);
}

/* Start-up refusals name the key: offload without a directory, a directory
 * that cannot be created. */
TEST(store_refuses_a_bad_tier_config)
{
    char out[4096];
    const char *a1[] = {tp_kvpool_bin(), "store", "--master", "127.0.0.1:1", "--segment-size",
                        "4MiB", "--enable-offload", "--master-optional", NULL};
    CHECK_EQ(tp_run_capture(a1, 2, out, sizeof out, 10000), 1);
    CHECK(strstr(out, "key \"enable_offload\" needs key \"offload_dir\"") != NULL);
    const char *a2[] = {tp_kvpool_bin(), "store", "--master", "127.0.0.1:1", "--segment-size",
                        "4MiB", "--enable-offload", "--offload-dir", "/proc/kvpool-nope",
                        "--offload-capacity", "128MiB", "--offload-page-size", "64MiB",
                        "--master-optional", NULL};
    CHECK_EQ(tp_run_capture(a2, 2, out, sizeof out, 10000), 1);
    CHECK(strstr(out, "/proc/kvpool-nope") != NULL);
}
