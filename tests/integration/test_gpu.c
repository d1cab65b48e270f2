/*
 * test_gpu.c -- device memory as the source and destination of every put
 * and get, against real `kvpool master` / `kvpool store` processes.
 *
 * Backend: the fake device (gpu_fake.c: device memory the CPU cannot touch,
 * late asynchronous copies, fault injection) unless KVPOOL_GPU_BACKEND=cuda
 * names the real driver (`make test-gpu`); then tests that need the fake's
 * faults skip, and everything else runs on the GPU, or the whole file skips
 * with the driver's reason when there is none.
 *
 * Covers: classification and registration (device, host, neither), round
 * trips of every size class over shm and tcp (values larger than a staging
 * buffer included), vLLM-shaped scattered pieces at odd offsets, mixed
 * host/device keys and batches, the segment page-locked once and copies
 * batched, corrupt replicas never reaching device memory, every device
 * error path (copy, stream, staging, wait, registration), threads, a node
 * killed in the middle of device batches.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client/client_int.h"
#include "client/gpu.h"
#include "harness.h"
#include "kvpool.h"
#include "proc.h"

#define KiB 1024ull
#define MiB (1024ull * 1024)

/* ---------------------------------------------------------------- env */

static int g_fake;

/* Chooses the backend for this test (each runs in its own process). 0, or
 * -1 when there is no device (the caller skips). */
static int backend_up(void)
{
    const char *b = getenv("KVPOOL_GPU_BACKEND");
    g_fake = !b || strcmp(b, "cuda") != 0;
    if (g_fake)
        kvp_gpu_use_fake();
    void *probe = kvp_gpu_dev_alloc(0, 4096);
    if (!probe)
        return -1;
    kvp_gpu_dev_free(probe);
    return 0;
}

#define NEED_DEVICE()                                                                          \
    do {                                                                                       \
        if (backend_up() != 0) {                                                               \
            static char why_[400];                                                             \
            snprintf(why_, sizeof why_, "no device: %s", kvp_gpu_status());                    \
            SKIP(why_);                                                                        \
        }                                                                                      \
    } while (0)

#define NEED_FAKE()                                                                            \
    do {                                                                                       \
        NEED_DEVICE();                                                                         \
        if (!g_fake)                                                                           \
            SKIP("needs the fake device's fault injection");                                   \
    } while (0)

typedef struct env {
    tp_master m;
    tp_store st;
} env;

static int env_up(env *e, const char *seg)
{
    memset(e, 0, sizeof *e);
    if (tp_master_start(&e->m, NULL) != 0)
        return -1;
    return tp_store_start(&e->st, e->m.addr, (const char *const[]){"--segment-size", seg, NULL});
}

static void env_down(env *e)
{
    tp_store_kill(&e->st);
    if (e->m.pid > 0)
        tp_master_kill(&e->m);
}

static kvp_client *open_client(const env *e, int tcp)
{
    char cfg[512], err[512];
    snprintf(cfg, sizeof cfg, "{\"master\": \"%s\", \"mode\": \"standalone-store\"}", e->m.addr);
    if (tcp)
        setenv("KVPOOL_FORCE_TCP", "1", 1);
    kvp_client *c = NULL;
    int rc = kvp_client_open(cfg, &c, err, sizeof err);
    unsetenv("KVPOOL_FORCE_TCP");
    if (rc)
        fprintf(stderr, "    kvp_client_open: %s (%s)\n", err, kvp_err_name(rc));
    return c;
}

/* ------------------------------------------------------------- values */


/* Device memory [d, d+len) holds tp_fill(seed)? (read back through the driver) */
static int dev_holds(const void *d, size_t len, uint64_t seed)
{
    uint8_t *got = malloc(len), *want = malloc(len);
    int ok = got && want && kvp_gpu_memcpy(got, d, len) == 0;
    if (ok) {
        tp_fill(want, len, seed);
        ok = memcmp(got, want, len) == 0;
    }
    free(got);
    free(want);
    return ok;
}

static int dev_fill(void *d, size_t len, uint64_t seed)
{
    uint8_t *h = malloc(len);
    if (!h)
        return -1;
    tp_fill(h, len, seed);
    int rc = kvp_gpu_memcpy(d, h, len);
    free(h);
    return rc;
}

/* ---------------------------------------------- classification, regs */

TEST(classify_and_register)
{
    NEED_DEVICE();
    uint8_t *d = kvp_gpu_dev_alloc(0, 1 * MiB);
    CHECK(d);
    struct kvp_gpu_dev *dev = NULL, *dev2 = NULL;
    CHECK_EQ(kvp_gpu_classify(d, MiB, &dev), 1);
    CHECK(dev);
    CHECK_EQ(kvp_gpu_classify(d + 4096, 100, &dev2), 1);
    CHECK(dev2 == dev);
    CHECK_EQ(kvp_gpu_classify(d + 4096, MiB, &dev2), KVP_EINVALID_PARAMS); /* past its end */
    uint8_t *h = malloc(4096);
    CHECK_EQ(kvp_gpu_classify(h, 4096, &dev2), 0);
    CHECK(dev2 == NULL);
    CHECK(kvp_gpu_host_mapped(h, 4096));
    CHECK(!kvp_gpu_host_mapped(d, 4096)); /* the CPU cannot touch device memory */

    env e;
    CHECK_EQ(env_up(&e, "32MiB"), 0);
    kvp_client *c = open_client(&e, 0);
    CHECK(c);
    CHECK_EQ(kvp_client_register_buffer(c, d, MiB), 0);
    CHECK_EQ(kvp_client_register_buffer(c, h, 4096), 0);
    CHECK_EQ(c->ndevregs, 1);
    /* neither host memory nor device memory: refused before any byte moves */
    void *none = mmap(NULL, 8192, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(none != MAP_FAILED);
    CHECK_EQ(kvp_client_register_buffer(c, none, 8192), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_client_unregister_buffer(c, d), 0);
    CHECK_EQ(c->ndevregs, 0);
    munmap(none, 8192);
    kvp_client_close(c);
    env_down(&e);
    free(h);
    kvp_gpu_dev_free(d);
}

static int dlopen_probe_loaded(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (h)
        dlclose(h);
    return h != NULL;
}

TEST(without_a_driver_device_memory_is_refused_clearly)
{
    /* auto mode in a process that never loaded libcuda: host memory only */
    unsetenv("KVPOOL_GPU_BACKEND");
    if (dlopen_probe_loaded())
        SKIP("libcuda.so.1 is loaded in this process");
    CHECK(!kvp_gpu_active());
    CHECK(strstr(kvp_gpu_status(), "libcuda.so.1 not loaded"));
    env e;
    CHECK_EQ(env_up(&e, "16MiB"), 0);
    kvp_client *c = open_client(&e, 0);
    CHECK(c);
    void *none = mmap(NULL, 8192, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK_EQ(kvp_client_register_buffer(c, none, 8192), KVP_EINVALID_PARAMS);
    char *h = malloc(100);
    memset(h, 7, 100);
    CHECK_EQ(kvp_client_put(c, "host", h, 100), 0); /* host memory: as ever */
    munmap(none, 8192);
    free(h);
    kvp_client_close(c);
    env_down(&e);
}

/* ---------------------------------------------------- round trips */

static const size_t k_sizes[] = {1, 4095, 4096, 32 * KiB, MiB + 3, 2 * MiB, 5 * MiB + 17, 16 * MiB};
#define NSIZES (sizeof k_sizes / sizeof k_sizes[0])

/* Every size: device -> pool -> device, device -> pool -> host, host ->
 * pool -> device; registered (reg) or not. */
static void sizes_body(int tcp, int reg)
{
    env e;
    CHECK_EQ(env_up(&e, "128MiB"), 0);
    kvp_client *c = open_client(&e, tcp);
    CHECK(c);
    size_t tot = 0;
    for (size_t i = 0; i < NSIZES; i++)
        tot += (k_sizes[i] + 4095) & ~(size_t)4095;
    uint8_t *src = kvp_gpu_dev_alloc(0, tot), *dst = kvp_gpu_dev_alloc(0, tot);
    uint8_t *host = malloc(16 * MiB);
    CHECK(src && dst && host);
    if (reg) {
        CHECK_EQ(kvp_client_register_buffer(c, src, tot), 0);
        CHECK_EQ(kvp_client_register_buffer(c, dst, tot), 0);
    }
    size_t off = 0;
    for (size_t i = 0; i < NSIZES; i++) {
        size_t n = k_sizes[i];
        char key[64];
        snprintf(key, sizeof key, "dev-%d-%zu", tcp, n);
        CHECK_EQ(dev_fill(src + off, n, n), 0);
        CHECK_EQ(kvp_client_put(c, key, src + off, n), 0);
        CHECK_EQ(kvp_client_get(c, key, dst + off, n), (int64_t)n);
        CHECK(dev_holds(dst + off, n, n));
        memset(host, 0, n);
        CHECK_EQ(kvp_client_get(c, key, host, n), (int64_t)n); /* put from device, get to host */
        uint8_t *want = malloc(n);
        tp_fill(want, n, n);
        CHECK(memcmp(host, want, n) == 0);
        snprintf(key, sizeof key, "host-%d-%zu", tcp, n); /* put from host, get to device */
        tp_fill(host, n, n + 1);
        CHECK_EQ(kvp_client_put(c, key, host, n), 0);
        CHECK_EQ(kvp_client_get(c, key, dst + off, n), (int64_t)n);
        CHECK(dev_holds(dst + off, n, n + 1));
        free(want);
        off += (n + 4095) & ~(size_t)4095;
    }
    /* device ops count on the path they took, as host ops do: per size two
     * puts (from device, from host) and three gets */
    uint64_t sum = 0;
    for (size_t i = 0; i < NSIZES; i++)
        sum += k_sizes[i];
    kvp_transfer_stats ts;
    kvp_transfer_stats_init(&ts);
    CHECK_EQ(kvp_client_stats(c, &ts), 0);
    const kvp_path_stats *on = &ts.path[tcp ? KVP_PATH_TCP : KVP_PATH_SHM];
    const kvp_path_stats *off_path = &ts.path[tcp ? KVP_PATH_SHM : KVP_PATH_TCP];
    CHECK(on->put_bytes == 2 * sum && on->put_ops == 2 * NSIZES);
    CHECK(on->get_bytes == 3 * sum && on->get_ops == 3 * NSIZES);
    CHECK(off_path->put_ops == 0 && off_path->get_ops == 0 && off_path->get_bytes == 0);
    if (g_fake && !tcp) {
        kvp_gpu_fake_stats st;
        kvp_gpu_fake_get_stats(&st);
        CHECK_EQ(st.pageable, 0); /* the segment mapping was page-locked */
    }
    kvp_client_close(c);
    env_down(&e);
    free(host);
    kvp_gpu_dev_free(src);
    kvp_gpu_dev_free(dst);
}

TEST(every_size_over_shm)
{
    NEED_DEVICE();
    sizes_body(0, 1);
}

TEST(every_size_over_tcp)
{
    NEED_DEVICE();
    sizes_body(1, 1);
}

/* The SSD tier into device memory: values put from device memory into a
 * 16 MiB segment with a disk tier, most of them spilled, come back into
 * device memory byte-exact (staged into DRAM by the node, then the usual
 * device paths), over shm and over tcp. */
static void disk_tier_body(int tcp)
{
    char dir[] = "/tmp/kvpool-gpu-tier-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    env e;
    memset(&e, 0, sizeof e);
    CHECK_EQ(tp_master_start(&e.m, NULL), 0);
    CHECK_EQ(tp_store_start(&e.st, e.m.addr,
                            (const char *const[]){"--segment-size", "16MiB", "--enable-offload",
                                                  "--offload-dir", dir, "--offload-capacity",
                                                  "256MiB", "--offload-page-size", "64MiB",
                                                  NULL}),
             0);
    kvp_client *c = open_client(&e, tcp);
    CHECK(c);
    enum { N = 40 };
    uint8_t *src = kvp_gpu_dev_alloc(0, MiB), *dst = kvp_gpu_dev_alloc(0, MiB);
    CHECK(src && dst);
    for (int i = 0; i < N; i++) {
        char key[64];
        snprintf(key, sizeof key, "gpu-tier-%d-%d", tcp, i);
        CHECK_EQ(dev_fill(src, MiB, (uint64_t)i + 100), 0);
        int rc;
        uint64_t end = tp_now_ms() + 20000;
        while ((rc = kvp_client_put(c, key, src, MiB)) == KVP_ENO_AVAILABLE_HANDLE &&
               tp_now_ms() < end)
            tp_sleep_ms(5);
        CHECK_EQ(rc, 0);
    }
    int on_disk = 0;
    for (int i = 0; i < N; i++) {
        char key[64];
        const char *kp = key;
        snprintf(key, sizeof key, "gpu-tier-%d-%d", tcp, i);
        int t = 0;
        CHECK_EQ(kvp_client_tiers(c, &kp, 1, &t), 0);
        on_disk += t == KVP_TIER_DISK;
        CHECK_EQ(kvp_client_get(c, key, dst, MiB), (int64_t)MiB);
        CHECK(dev_holds(dst, MiB, (uint64_t)i + 100));
    }
    CHECK(on_disk >= N - 16); /* those were read back from disk */
    kvp_client_close(c);
    env_down(&e);
    kvp_gpu_dev_free(src);
    kvp_gpu_dev_free(dst);
    tp_rm_dir(dir);
}

TEST(disk_tier_into_device_memory_shm)
{
    NEED_DEVICE();
    disk_tier_body(0);
}

TEST(disk_tier_into_device_memory_tcp)
{
    NEED_DEVICE();
    disk_tier_body(1);
}

TEST(unregistered_device_pointers)
{
    NEED_DEVICE();
    sizes_body(0, 0);
}

/* vLLM's shape: keys of 64 pieces of 32 KiB scattered over a device
 * region, at odd offsets; some keys hold a host piece too; a batch mixes
 * device keys and host-only keys. */
#define VK 24
#define VP 64
#define VPIECE (32 * KiB)
static void scatter_body(int tcp)
{
    env e;
    CHECK_EQ(env_up(&e, "256MiB"), 0);
    kvp_client *c = open_client(&e, tcp);
    CHECK(c);
    size_t region = 96 * MiB;
    uint8_t *src = kvp_gpu_dev_alloc(0, region), *dst = kvp_gpu_dev_alloc(0, region);
    CHECK(src && dst);
    CHECK_EQ(kvp_client_register_buffer(c, src, region), 0);
    CHECK_EQ(kvp_client_register_buffer(c, dst, region), 0);
    uint8_t *hsrc = malloc(VK * VPIECE), *hdst = malloc(VK * VPIECE);
    CHECK(hsrc && hdst);
    CHECK_EQ(dev_fill(src, region, 42), 0);
    tp_fill(hsrc, VK * VPIECE, 43);
    static kvp_iov pv[VK][VP], gv[VK][VP];
    const kvp_iov *pp[VK], *gp[VK];
    size_t np[VK];
    char names[VK][32];
    const char *keys[VK];
    uint64_t rng = 7;
    for (int k = 0; k < VK; k++) {
        snprintf(names[k], sizeof names[k], "v-%d-%d", tcp, k);
        keys[k] = names[k];
        np[k] = VP;
        for (int i = 0; i < VP; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            /* slot (k * VP + i) of the region, shuffled, at an odd byte offset */
            size_t slot = (size_t)((k * VP + i) * 7 % (VK * VP));
            size_t o = slot * (VPIECE + 64) + 1 + (rng >> 60);
            pv[k][i] = (kvp_iov){src + o, VPIECE};
            gv[k][i] = (kvp_iov){dst + o, VPIECE};
        }
        if (k % 4 == 1) { /* a host piece among device pieces */
            pv[k][0] = (kvp_iov){hsrc + k * VPIECE, VPIECE};
            gv[k][0] = (kvp_iov){hdst + k * VPIECE, VPIECE};
        }
        if (k % 4 == 3) { /* a key of host memory only, in the same batch */
            np[k] = 1;
            pv[k][0] = (kvp_iov){hsrc + k * VPIECE, VPIECE};
            gv[k][0] = (kvp_iov){hdst + k * VPIECE, VPIECE};
        }
        pp[k] = pv[k];
        gp[k] = gv[k];
    }
    int64_t res[VK];
    CHECK_EQ(kvp_client_batch_put_from_multi_buffers(c, keys, pp, np, VK, res), 0);
    for (int k = 0; k < VK; k++)
        CHECK_EQ(res[k], (int64_t)(np[k] * VPIECE));
    CHECK_EQ(kvp_client_batch_get_into_multi_buffers(c, keys, gp, np, VK, res), 0);
    for (int k = 0; k < VK; k++)
        CHECK_EQ(res[k], (int64_t)(np[k] * VPIECE));
    /* every piece where it belongs */
    uint8_t *a = malloc(VPIECE), *b = malloc(VPIECE);
    for (int k = 0; k < VK; k++)
        for (size_t i = 0; i < np[k]; i++) {
            const kvp_iov *s = &pv[k][i], *d = &gv[k][i];
            int sh = (uint8_t *)s->base >= hsrc && (uint8_t *)s->base < hsrc + VK * VPIECE;
            if (sh)
                memcpy(a, s->base, VPIECE);
            else
                CHECK_EQ(kvp_gpu_memcpy(a, s->base, VPIECE), 0);
            if (sh)
                memcpy(b, d->base, VPIECE);
            else
                CHECK_EQ(kvp_gpu_memcpy(b, d->base, VPIECE), 0);
            CHECK(memcmp(a, b, VPIECE) == 0);
        }
    if (g_fake) {
        kvp_gpu_fake_stats st;
        kvp_gpu_fake_get_stats(&st);
        /* batched: one copy call per key (per staging slot over tcp), not per piece */
        CHECK(st.copy_calls < st.copies / 8);
    }
    free(a);
    free(b);
    free(hsrc);
    free(hdst);
    kvp_client_close(c);
    env_down(&e);
    kvp_gpu_dev_free(src);
    kvp_gpu_dev_free(dst);
}

TEST(vllm_shaped_pieces_over_shm)
{
    NEED_DEVICE();
    scatter_body(0);
}

TEST(vllm_shaped_pieces_over_tcp)
{
    NEED_DEVICE();
    scatter_body(1);
}

/* ------------------------------------------------------- corruption */

/* The segment id and offset of key's first replica (describe_json). */
static int locate(kvp_client *c, const char *key, uint64_t *seg, uint64_t *off)
{
    char js[2048];
    REQUIRE(kvp_client_describe_json(c, key, js, sizeof js) > 0);
    const char *s = strstr(js, "\"segment\": \""), *o = strstr(js, "\"offset\": ");
    REQUIRE(s && o);
    *seg = strtoull(s + 12, NULL, 16);
    *off = strtoull(o + 10, NULL, 10);
    return 0;
}

/* A corrupt replica read into device memory: CHECKSUM_MISMATCH, and the
 * device bytes are untouched (the value fits one staging buffer). */
static void corrupt_body(int tcp)
{
    env e;
    CHECK_EQ(env_up(&e, "32MiB"), 0);
    kvp_client *c = open_client(&e, 0), *t = tcp ? open_client(&e, 1) : NULL;
    CHECK(c && (!tcp || t));
    size_t n = 256 * KiB;
    uint8_t *h = malloc(n);
    tp_fill(h, n, 5);
    CHECK_EQ(kvp_client_put(c, "bad", h, n), 0);
    uint64_t seg, off, msize;
    CHECK_EQ(locate(c, "bad", &seg, &off), 0);
    uint8_t *map = kvp_xfer_shm_map(c->xfer, seg, &msize);
    CHECK(map && off + n <= msize);
    map[off + n / 2] ^= 0x40; /* behind the node's back */
    uint8_t *d = kvp_gpu_dev_alloc(0, n);
    CHECK(d);
    CHECK_EQ(dev_fill(d, n, 99), 0);
    CHECK_EQ(kvp_client_get(tcp ? t : c, "bad", d, n), KVP_ECHECKSUM_MISMATCH);
    CHECK(dev_holds(d, n, 99)); /* nothing of it reached the device */
    free(h);
    kvp_gpu_dev_free(d);
    if (t)
        kvp_client_close(t);
    kvp_client_close(c);
    env_down(&e);
}

TEST(corrupt_replica_never_reaches_device_shm)
{
    NEED_DEVICE();
    corrupt_body(0);
}

TEST(corrupt_replica_never_reaches_device_tcp)
{
    NEED_DEVICE();
    corrupt_body(1);
}

/* --------------------------------------------------------- errors */

/* With fault `op` armed at its n-th call: a put and a get of device keys
 * over tcp or shm fail with DEVICE (or succeed when the fault hit
 * nothing), nothing wrong is ever visible, and the next round trip works. */
static void fault_body(const char *op, int nth, int tcp)
{
    env e;
    CHECK_EQ(env_up(&e, "64MiB"), 0);
    kvp_client *c = open_client(&e, tcp);
    CHECK(c);
    size_t n = 6 * MiB; /* > one staging buffer */
    uint8_t *d = kvp_gpu_dev_alloc(0, 2 * n);
    CHECK(d);
    CHECK_EQ(kvp_client_register_buffer(c, d, 2 * n), 0);
    CHECK_EQ(dev_fill(d, n, 11), 0);
    kvp_gpu_fake_fail(op, nth);
    int prc = kvp_client_put(c, "k1", d, n);
    CHECK(prc == 0 || prc == KVP_EDEVICE);
    int64_t grc = kvp_client_get(c, "k1", d + n, n);
    if (prc == KVP_EDEVICE)
        CHECK_EQ(grc, KVP_EOBJECT_NOT_FOUND); /* a failed put is never visible */
    else
        CHECK(grc == (int64_t)n || grc == KVP_EDEVICE);
    if (grc == (int64_t)n)
        CHECK(dev_holds(d + n, n, 11));
    kvp_gpu_fake_fail(NULL, 0);
    CHECK_EQ(kvp_client_put(c, "k2", d, n), 0);
    CHECK_EQ(dev_fill(d + n, n, 0), 0);
    CHECK_EQ(kvp_client_get(c, "k2", d + n, n), (int64_t)n);
    CHECK(dev_holds(d + n, n, 11));
    kvp_client_close(c);
    env_down(&e);
    kvp_gpu_dev_free(d);
}

TEST(device_faults_fail_that_key_only)
{
    NEED_FAKE();
    static const char *ops[] = {"copy", "wait", "stream", "stage"};
    for (int tcp = 0; tcp < 2; tcp++)
        for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
            for (int nth = 1; nth <= 3; nth++) {
                fault_body(ops[i], nth, tcp);
                if (th_failed()) {
                    fprintf(stderr, "    fault %s #%d over %s\n", ops[i], nth, tcp ? "tcp" : "shm");
                    return;
                }
            }
}

TEST(segment_that_cannot_be_pinned_still_works)
{
    NEED_FAKE();
    kvp_gpu_fake_fail("register", 1);
    env e;
    CHECK_EQ(env_up(&e, "32MiB"), 0);
    kvp_client *c = open_client(&e, 0);
    size_t n = MiB;
    uint8_t *d = kvp_gpu_dev_alloc(0, 2 * n);
    CHECK(c && d);
    CHECK_EQ(dev_fill(d, n, 3), 0);
    CHECK_EQ(kvp_client_put(c, "p", d, n), 0);
    CHECK_EQ(kvp_client_get(c, "p", d + n, n), (int64_t)n);
    CHECK(dev_holds(d + n, n, 3));
    kvp_gpu_fake_stats st;
    kvp_gpu_fake_get_stats(&st);
    CHECK(st.pageable > 0); /* correct, through the slower path */
    kvp_client_close(c);
    env_down(&e);
    kvp_gpu_dev_free(d);
}

TEST(device_range_past_its_allocation_refused)
{
    NEED_DEVICE();
    env e;
    CHECK_EQ(env_up(&e, "16MiB"), 0);
    kvp_client *c = open_client(&e, 0);
    uint8_t *d = kvp_gpu_dev_alloc(0, 8192);
    CHECK(c && d);
    /* a device range registered as one region but crossing its allocation */
    CHECK_EQ(kvp_client_register_buffer(c, d + 4096, 8192), KVP_EINVALID_PARAMS);
    /* the same range unregistered, in a batch: that key refused, untouched; the other stored */
    uint8_t h[64] = {1};
    const char *keys[2] = {"cross", "fine"};
    kvp_iov v0 = {d + 4096, 8192}, v1 = {h, sizeof h};
    const kvp_iov *vp[2] = {&v0, &v1};
    size_t one[2] = {1, 1};
    int64_t res[2];
    CHECK_EQ(kvp_client_batch_put_from_multi_buffers(c, keys, vp, one, 2, res), 0);
    CHECK_EQ(res[0], KVP_EINVALID_PARAMS);
    CHECK_EQ(res[1], (int64_t)sizeof h);
    CHECK_EQ(kvp_client_get(c, "cross", h, sizeof h), KVP_EOBJECT_NOT_FOUND);
    kvp_client_close(c);
    env_down(&e);
    kvp_gpu_dev_free(d);
}

/* -------------------------------------------------------- threads */

typedef struct tharg {
    kvp_client *c;
    uint8_t *d;
    int id, bad;
} tharg;

static void *th_main(void *p)
{
    tharg *a = p;
    size_t n = 512 * KiB;
    for (int r = 0; r < 12 && !a->bad; r++) {
        char key[64];
        snprintf(key, sizeof key, "t%d-%d", a->id, r);
        uint64_t seed = (uint64_t)a->id * 1000 + (uint64_t)r;
        if (dev_fill(a->d, n, seed) || kvp_client_put(a->c, key, a->d, n) != 0 ||
            kvp_client_get(a->c, key, a->d + n, n) != (int64_t)n || !dev_holds(a->d + n, n, seed))
            a->bad = 1;
    }
    return NULL;
}

static void threads_body(int tcp)
{
    env e;
    CHECK_EQ(env_up(&e, "128MiB"), 0);
    kvp_client *c = open_client(&e, tcp);
    CHECK(c);
    tharg a[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (tharg){c, kvp_gpu_dev_alloc(0, MiB), i, 0};
        CHECK(a[i].d);
        pthread_create(&th[i], NULL, th_main, &a[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ(a[i].bad, 0);
        kvp_gpu_dev_free(a[i].d);
    }
    kvp_client_close(c);
    env_down(&e);
}

TEST(threads_shm)
{
    NEED_DEVICE();
    threads_body(0);
}

TEST(threads_tcp)
{
    NEED_DEVICE();
    threads_body(1);
}

/* ------------------------------------------------ node killed mid-batch */

typedef struct killarg {
    kvp_client *c;
    uint8_t *d;
    int rounds, wrong, hung;
} killarg;

static void *kill_main(void *p)
{
    killarg *a = p;
    enum { K = 16 };
    size_t n = 1 * MiB;
    for (int r = 0; r < 40; r++) {
        char names[K][32];
        const char *keys[K];
        kvp_iov v[K];
        const kvp_iov *vp[K];
        size_t one[K];
        int64_t res[K];
        for (int k = 0; k < K; k++) {
            snprintf(names[k], sizeof names[k], "kill-%d-%d", r, k);
            keys[k] = names[k];
            v[k] = (kvp_iov){a->d + (size_t)k * n, n};
            vp[k] = &v[k];
            one[k] = 1;
        }
        uint64_t t0 = tp_now_ms();
        kvp_client_batch_put_from_multi_buffers(a->c, keys, vp, one, K, res);
        if (tp_now_ms() - t0 > 15000)
            a->hung = 1;
        for (int k = 0; k < K; k++)
            if (res[k] == (int64_t)n) { /* a published key reads back right or not at all */
                int64_t g = kvp_client_get(a->c, keys[k], a->d + (size_t)(K + 1) * n, n);
                if (g == (int64_t)n && !dev_holds(a->d + (size_t)(K + 1) * n, n, (uint64_t)k))
                    a->wrong++;
            }
        a->rounds++;
    }
    return NULL;
}

TEST(node_killed_mid_batch)
{
    NEED_DEVICE();
    for (int tcp = 0; tcp < 2; tcp++) {
        env e;
        CHECK_EQ(env_up(&e, "128MiB"), 0);
        kvp_client *c = open_client(&e, tcp);
        CHECK(c);
        uint8_t *d = kvp_gpu_dev_alloc(0, 18 * MiB);
        CHECK(d);
        for (int k = 0; k < 16; k++)
            CHECK_EQ(dev_fill(d + (size_t)k * MiB, MiB, (uint64_t)k), 0);
        killarg a = {c, d, 0, 0, 0};
        pthread_t th;
        pthread_create(&th, NULL, kill_main, &a);
        tp_sleep_ms(300);
        tp_store_kill(&e.st);
        pthread_join(th, NULL);
        CHECK_EQ(a.wrong, 0);
        CHECK_EQ(a.hung, 0);
        CHECK_EQ(a.rounds, 40);
        kvp_client_close(c);
        env_down(&e);
        kvp_gpu_dev_free(d);
    }
}
