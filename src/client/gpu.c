/*
 * gpu.c -- device memory for the data plane; see gpu.h.
 *
 * This file holds what both backends share: the choice of backend, tickets
 * on top of the backend's per-stream markers, and the pools of streams and
 * staging rings. The backends (gpu_cuda.c, gpu_fake.c) implement memory
 * and copies behind kvp_gpu_backend (gpu_backend.h).
 *
 * Choice (once per process, from KVPOOL_GPU_BACKEND):
 *   unset / auto  cuda, as soon as this process has loaded libcuda.so.1
 *                 (checked with RTLD_NOLOAD until it has: a process that
 *                 never touched CUDA holds no device pointer, and never has
 *                 CUDA initialised by us); test and benchmark allocations
 *                 (kvp_gpu_dev_alloc) load it
 *   cuda          load and use the driver at first need
 *   fake          the test backend
 *   off           host memory only
 */
#include "client/gpu.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/gpu_backend.h"
#include "common/assert.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/size.h"
#include "kvpool.h"

#define MOD "gpu"

enum { MODE_AUTO, MODE_CUDA, MODE_FAKE, MODE_OFF };

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_mode = -1;                  /* under g_mu until set */
static const kvp_gpu_backend *g_be;      /* atomic: set once */
static char g_status[320] = "off";       /* under g_mu */

/* ------------------------------------------------------------ backend */

static void mode_init_locked(void)
{
    if (g_mode >= 0)
        return;
    const char *e = getenv("KVPOOL_GPU_BACKEND");
    g_mode = MODE_AUTO;
    if (e && !strcmp(e, "cuda"))
        g_mode = MODE_CUDA;
    else if (e && !strcmp(e, "fake"))
        g_mode = MODE_FAKE;
    else if (e && !strcmp(e, "off"))
        g_mode = MODE_OFF;
    else if (e && *e && strcmp(e, "auto"))
        KVP_WARN(MOD, "KVPOOL_GPU_BACKEND=%s: not one of auto, cuda, fake, off; using auto", e);
    snprintf(g_status, sizeof g_status, "%s",
             g_mode == MODE_OFF ? "off: KVPOOL_GPU_BACKEND=off (host memory only)"
                                : "off: libcuda.so.1 not loaded in this process");
}

/* The backend, or NULL. force: load the driver now (auto and cuda modes). */
static const kvp_gpu_backend *backend(int force)
{
    const kvp_gpu_backend *b = __atomic_load_n(&g_be, __ATOMIC_ACQUIRE);
    if (b)
        return b;
    pthread_mutex_lock(&g_mu);
    mode_init_locked();
    if (!g_be && g_mode == MODE_FAKE) {
        g_be = kvp_gpu_fake_open();
        snprintf(g_status, sizeof g_status, "fake: the test backend (no GPU is used)");
    } else if (!g_be && (g_mode == MODE_CUDA || g_mode == MODE_AUTO)) {
        char why[256] = "";
        const kvp_gpu_backend *c = kvp_gpu_cuda_open(force || g_mode == MODE_CUDA, why, sizeof why);
        if (c) {
            __atomic_store_n(&g_be, c, __ATOMIC_RELEASE);
            snprintf(g_status, sizeof g_status, "cuda: %s", why);
        } else if (why[0]) {
            snprintf(g_status, sizeof g_status, "off: %s", why);
        }
    }
    b = g_be;
    pthread_mutex_unlock(&g_mu);
    return b;
}

const char *kvp_gpu_status(void)
{
    static __thread char copy[sizeof g_status];
    backend(0);
    pthread_mutex_lock(&g_mu);
    memcpy(copy, g_status, sizeof copy);
    pthread_mutex_unlock(&g_mu);
    return copy;
}

int kvp_gpu_active(void) { return backend(0) != NULL; }

void kvp_gpu_use_fake(void)
{
    pthread_mutex_lock(&g_mu);
    mode_init_locked();
    g_mode = MODE_FAKE;
    pthread_mutex_unlock(&g_mu);
    backend(0);
}

/* The driver is loaded but a call failed at a point where this process
 * may hold device pointers: say so once per reason. */
static int device_error(const char *what)
{
    KVP_WARN_LIMITED(MOD, "%s failed (%s)", what, kvp_gpu_status());
    return KVP_EDEVICE;
}

int kvp_gpu_classify(const void *p, size_t len, kvp_gpu_dev **dev)
{
    *dev = NULL;
    const kvp_gpu_backend *b = backend(0);
    if (!b || len == 0)
        return 0;
    return b->classify(p, len, dev);
}

int kvp_gpu_host_mapped(const void *ptr, size_t len)
{
    uintptr_t p = (uintptr_t)ptr;
    if (len == 0 || len > UINTPTR_MAX - p)
        return 0;
    uintptr_t cur = p, end = p + len;
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f)
        return 0;
    char line[512];
    while (cur < end && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perms[8];
        size_t l = strlen(line);
        if (l && line[l - 1] != '\n') { /* skip the rest of a long line (a path) */
            char more[512];
            while (fgets(more, sizeof more, f) && !strchr(more, '\n'))
                ;
        }
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3)
            continue;
        if (hi <= cur)
            continue;
        if (lo > cur || perms[0] != 'r' || perms[1] != 'w')
            break; /* a hole, or not read-write */
        cur = hi;
    }
    fclose(f);
    return cur >= end;
}

int kvp_gpu_host_register(void *p, size_t len)
{
    const kvp_gpu_backend *b = backend(0);
    if (!b)
        return KVP_EDEVICE;
    return b->host_register(p, len) == 0 ? 0 : device_error("page-locking host memory");
}

void kvp_gpu_host_unregister(void *p)
{
    const kvp_gpu_backend *b = backend(0);
    if (b && p)
        b->host_unregister(p);
}

/* ------------------------------------------------------------ streams */

struct kvp_gpu_stream {
    kvp_gpu_dev *dev;
    void *bs;              /* the backend's stream */
    uint64_t next;         /* last ticket handed out */
    uint64_t passed;       /* every ticket <= passed is done */
    int failed;            /* a copy or marker failed: the stream is not pooled */
    kvp_gpu_stream *free_next;
};

static kvp_gpu_stream *g_free_streams; /* under g_mu */

kvp_gpu_stream *kvp_gpu_stream_get(kvp_gpu_dev *dev)
{
    const kvp_gpu_backend *b = backend(0);
    if (!b)
        return NULL;
    pthread_mutex_lock(&g_mu);
    for (kvp_gpu_stream **pp = &g_free_streams; *pp; pp = &(*pp)->free_next)
        if ((*pp)->dev == dev) {
            kvp_gpu_stream *s = *pp;
            *pp = s->free_next;
            pthread_mutex_unlock(&g_mu);
            s->free_next = NULL;
            return s;
        }
    pthread_mutex_unlock(&g_mu);
    kvp_gpu_stream *s = kvp_calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->dev = dev;
    s->bs = b->stream_new(dev);
    if (!s->bs) {
        kvp_free(s);
        device_error("creating a stream");
        return NULL;
    }
    return s;
}

void kvp_gpu_stream_put(kvp_gpu_stream *s)
{
    if (!s)
        return;
    const kvp_gpu_backend *b = backend(0);
    if (b->drain(s->bs) != 0) /* nothing may still be copying into memory we give back */
        s->failed = 1;        /* and a stream that failed is not pooled */
    s->passed = s->next;
    if (s->failed) {
        b->stream_free(s->bs);
        kvp_free(s);
        return;
    }
    pthread_mutex_lock(&g_mu);
    s->free_next = g_free_streams;
    g_free_streams = s;
    pthread_mutex_unlock(&g_mu);
}

int kvp_gpu_stream_bind(kvp_gpu_stream *s)
{
    return backend(0)->bind(s->dev) == 0 ? 0 : device_error("making the device current");
}

int kvp_gpu_copy(kvp_gpu_stream *s, int dir, const kvp_gpu_piece *p, size_t n)
{
    if (n == 0)
        return 0;
    if (s->failed || backend(0)->copy(s->bs, dir, p, n) != 0) {
        s->failed = 1;
        return device_error(dir == KVP_GPU_D2H ? "copying device to host" : "copying host to device");
    }
    return 0;
}

uint64_t kvp_gpu_mark(kvp_gpu_stream *s)
{
    uint64_t t = s->next + 1;
    /* marker slot t % TICKETS is reused: its previous ticket must be done */
    if (t > KVP_GPU_TICKETS && s->passed < t - KVP_GPU_TICKETS &&
        kvp_gpu_wait(s, t - KVP_GPU_TICKETS, 0) != 0)
        return 0;
    if (s->failed || backend(0)->mark(s->bs, t) != 0) {
        s->failed = 1;
        device_error("recording an event");
        return 0;
    }
    s->next = t;
    return t;
}

int kvp_gpu_wait(kvp_gpu_stream *s, uint64_t t, uint64_t deadline_ms)
{
    const kvp_gpu_backend *b = backend(0);
    if (t == 0) {
        if (b->drain(s->bs) != 0)
            s->failed = 1;
        s->passed = s->next;
        return s->failed ? KVP_EDEVICE : 0;
    }
    /* a ticket not yet passed is one of the last TICKETS handed out */
    KVP_ASSERT(t <= s->passed || (t <= s->next && t + KVP_GPU_TICKETS > s->next));
    for (unsigned spins = 0; t > s->passed; spins++) {
        int d = b->done(s->bs, t);
        if (d == 0) {
            s->passed = t;
            break;
        }
        if (d < 0) {
            s->failed = 1;
            return device_error("a copy on the stream");
        }
        if (deadline_ms && kvp_now_ms() >= deadline_ms)
            return KVP_ERPC_TIMEOUT;
        if (spins < 64) {
            sched_yield();
        } else {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
    return s->failed ? KVP_EDEVICE : 0;
}

/* ------------------------------------------------------- staging rings */

struct kvp_gpu_stage {
    uint8_t *mem;
    size_t slots, slot_bytes;
    kvp_gpu_stage *free_next;
};

static pthread_cond_t g_stage_cv;
static pthread_once_t g_stage_once = PTHREAD_ONCE_INIT;
static kvp_gpu_stage *g_free_stages; /* under g_mu */
static size_t g_stages, g_max_stages, g_slots, g_slot_bytes;

static uint64_t env_size(const char *name, uint64_t def, uint64_t lo, uint64_t hi)
{
    const char *e = getenv(name);
    uint64_t v;
    if (!e || !*e)
        return def;
    if (kvp_size_parse(e, &v) != 0 || v < lo || v > hi) {
        KVP_WARN(MOD, "%s=%s: not a size from %llu to %llu; using %llu", name, e,
                 (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)def);
        return def;
    }
    return v;
}

static void stage_init(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&g_stage_cv, &a);
    pthread_condattr_destroy(&a);
    g_slots = (size_t)env_size("KVPOOL_GPU_STAGE_SLOTS", 4, 2, 64);
    g_slot_bytes = (size_t)env_size("KVPOOL_GPU_STAGE_BYTES", 4u << 20, 64u << 10, 256u << 20);
    g_slot_bytes = (g_slot_bytes + 4095) & ~(size_t)4095;
    g_max_stages = (size_t)env_size("KVPOOL_GPU_STAGE_RINGS", 8, 1, 1024);
}

kvp_gpu_stage *kvp_gpu_stage_get(kvp_gpu_dev *dev, uint64_t deadline_ms)
{
    const kvp_gpu_backend *b = backend(0);
    if (!b)
        return NULL;
    pthread_once(&g_stage_once, stage_init);
    pthread_mutex_lock(&g_mu);
    while (!g_free_stages && g_stages >= g_max_stages) {
        struct timespec ts = {(time_t)(deadline_ms / 1000), (long)(deadline_ms % 1000) * 1000000};
        if (kvp_now_ms() >= deadline_ms ||
            (pthread_cond_timedwait(&g_stage_cv, &g_mu, &ts) == ETIMEDOUT &&
             !g_free_stages && g_stages >= g_max_stages)) {
            pthread_mutex_unlock(&g_mu);
            return NULL;
        }
    }
    kvp_gpu_stage *st = g_free_stages;
    if (st) {
        g_free_stages = st->free_next;
        pthread_mutex_unlock(&g_mu);
        return st;
    }
    g_stages++; /* counted now: the allocation below runs unlocked */
    pthread_mutex_unlock(&g_mu);
    st = kvp_calloc(1, sizeof *st);
    if (st) {
        if (dev)
            b->bind(dev);
        st->slots = g_slots;
        st->slot_bytes = g_slot_bytes;
        st->mem = b->host_alloc(g_slots * g_slot_bytes);
    }
    if (!st || !st->mem) {
        kvp_free(st);
        pthread_mutex_lock(&g_mu);
        g_stages--;
        pthread_cond_signal(&g_stage_cv);
        pthread_mutex_unlock(&g_mu);
        device_error("allocating page-locked staging memory");
        return NULL;
    }
    return st;
}

void kvp_gpu_stage_put(kvp_gpu_stage *st)
{
    if (!st)
        return;
    pthread_mutex_lock(&g_mu);
    st->free_next = g_free_stages;
    g_free_stages = st;
    pthread_cond_signal(&g_stage_cv);
    pthread_mutex_unlock(&g_mu);
}

size_t kvp_gpu_stage_slots(const kvp_gpu_stage *st) { return st->slots; }
size_t kvp_gpu_stage_slot_bytes(const kvp_gpu_stage *st) { return st->slot_bytes; }
uint8_t *kvp_gpu_stage_slot(kvp_gpu_stage *st, size_t i)
{
    KVP_ASSERT(i < st->slots);
    return st->mem + i * st->slot_bytes;
}

/* ------------------------------------- for tests, benchmarks, checks */

void *kvp_gpu_dev_alloc(int ordinal, size_t len)
{
    const kvp_gpu_backend *b = backend(1);
    return b && len ? b->dev_alloc(ordinal, len) : NULL;
}

void kvp_gpu_dev_free(void *p)
{
    const kvp_gpu_backend *b = backend(0);
    if (b && p)
        b->dev_free(p);
}

int kvp_gpu_memcpy(void *dst, const void *src, size_t len)
{
    const kvp_gpu_backend *b = backend(1);
    if (!b)
        return KVP_EDEVICE;
    return len == 0 || b->memcpy_sync(dst, src, len) == 0 ? 0 : device_error("cuMemcpy");
}

void *kvp_gpu_host_alloc(size_t len)
{
    const kvp_gpu_backend *b = backend(1);
    return b && len ? b->host_alloc(len) : NULL;
}

void kvp_gpu_host_free(void *p)
{
    const kvp_gpu_backend *b = backend(0);
    if (b && p)
        b->host_free(p);
}

const char *kvp_gpu_copy_mode(void)
{
    const kvp_gpu_backend *b = backend(0);
    return b ? b->copy_mode() : "none";
}
