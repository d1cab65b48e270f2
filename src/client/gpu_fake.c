/*
 * gpu_fake.c -- the test backend of gpu.h: device memory and a copy engine
 * built from host memory, so that the device paths of the data plane run
 * (and fail) on machines without a GPU.
 *
 * Device memory: a memfd mapped twice. The address handed out is mapped
 * PROT_NONE, so any CPU access to "device memory" faults as it would on a
 * real GPU (the sanitizers report it); the second, read-write mapping is
 * where this backend's copy engine alone reads and writes.
 *
 * Streams: one thread each, executing copies and markers in order. Copies
 * run later than they are enqueued (a yield, sometimes a sleep), so a
 * caller that reads a destination without waiting for its ticket reads
 * stale bytes and its test fails. Host pieces that were not page-locked
 * (registered or allocated here) are copied but counted (`pageable`), so
 * tests can assert that the data plane registers what it DMAs.
 *
 * Faults: kvp_gpu_fake_fail(op, n) makes the n-th later call of op fail:
 * "copy" (enqueue refused), "wait" (a copy fails on the stream: the next
 * done() reports it), "register", "stream", "stage" (host_alloc),
 * "classify".
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "client/gpu_backend.h"
#include "common/mem.h"
#include "kvpool.h"

#define MAX_ALLOCS 256
#define MAX_REGS 4096

typedef struct falloc {
    uint8_t *dview;  /* PROT_NONE: the "device address" */
    uint8_t *shadow; /* read-write: the engine's view */
    size_t len;
} falloc;

typedef struct freg {
    uintptr_t base;
    size_t len;
    int owned; /* host_alloc'd here: munmap on free */
} freg;

struct kvp_gpu_dev {
    int ordinal;
};

static pthread_mutex_t f_mu = PTHREAD_MUTEX_INITIALIZER;
static falloc f_allocs[MAX_ALLOCS];
static freg f_regs[MAX_REGS];
static size_t f_nregs;
static struct kvp_gpu_dev f_dev = {0};
static char f_fail_op[16];
static int f_fail_n;
static kvp_gpu_fake_stats f_stats;

/* 1 when the armed fault is for op and this call is its n-th. */
static int should_fail(const char *op)
{
    pthread_mutex_lock(&f_mu);
    int r = 0;
    if (f_fail_n > 0 && !strcmp(f_fail_op, op) && --f_fail_n == 0)
        r = 1;
    pthread_mutex_unlock(&f_mu);
    return r;
}

void kvp_gpu_fake_fail(const char *op, int n)
{
    pthread_mutex_lock(&f_mu);
    snprintf(f_fail_op, sizeof f_fail_op, "%s", op ? op : "");
    f_fail_n = n > 0 ? n : 0;
    pthread_mutex_unlock(&f_mu);
}

void kvp_gpu_fake_get_stats(kvp_gpu_fake_stats *out)
{
    pthread_mutex_lock(&f_mu);
    *out = f_stats;
    out->registered = f_nregs;
    pthread_mutex_unlock(&f_mu);
}

/* The engine's address of device range [p, p+len), or NULL (not inside one
 * allocation). Caller holds f_mu. */
static uint8_t *shadow_of(const void *p, size_t len, int *partial)
{
    uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < MAX_ALLOCS; i++) {
        falloc *f = &f_allocs[i];
        if (!f->dview || a < (uintptr_t)f->dview || a >= (uintptr_t)f->dview + f->len)
            continue;
        size_t off = a - (uintptr_t)f->dview;
        if (len > f->len - off) {
            if (partial)
                *partial = 1;
            return NULL;
        }
        return f->shadow + off;
    }
    return NULL;
}

static int is_pinned(const void *p, size_t len)
{
    uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; i < f_nregs; i++)
        if (a >= f_regs[i].base && len <= f_regs[i].len && a - f_regs[i].base <= f_regs[i].len - len)
            return 1;
    return 0;
}

static int fake_classify(const void *p, size_t len, kvp_gpu_dev **dev)
{
    if (should_fail("classify"))
        return KVP_EDEVICE;
    int partial = 0;
    pthread_mutex_lock(&f_mu);
    uint8_t *s = shadow_of(p, len, &partial);
    pthread_mutex_unlock(&f_mu);
    if (partial)
        return KVP_EINVALID_PARAMS;
    if (!s)
        return 0;
    *dev = &f_dev;
    return 1;
}

static int add_reg(void *p, size_t len, int owned)
{
    pthread_mutex_lock(&f_mu);
    int rc = KVP_EDEVICE;
    if (f_nregs < MAX_REGS) {
        f_regs[f_nregs++] = (freg){(uintptr_t)p, len, owned};
        rc = 0;
    }
    pthread_mutex_unlock(&f_mu);
    return rc;
}

/* Removes the registration at base p: its length (0 when none). */
static size_t del_reg(void *p, int *owned)
{
    size_t len = 0;
    pthread_mutex_lock(&f_mu);
    for (size_t i = 0; i < f_nregs; i++)
        if (f_regs[i].base == (uintptr_t)p) {
            len = f_regs[i].len;
            *owned = f_regs[i].owned;
            f_regs[i] = f_regs[--f_nregs];
            break;
        }
    pthread_mutex_unlock(&f_mu);
    return len;
}

static int fake_host_register(void *p, size_t len)
{
    if (should_fail("register"))
        return KVP_EDEVICE;
    return add_reg(p, len, 0);
}

static void fake_host_unregister(void *p)
{
    int owned = 0;
    del_reg(p, &owned);
}

/* ------------------------------------------------------------ streams */

typedef struct item {
    struct item *next;
    uint64_t mark;     /* > 0: a marker */
    int fail;          /* the copy "fails on the device" */
    size_t n;
    kvp_gpu_piece p[]; /* engine addresses */
} item;

typedef struct fstream {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    item *head, *tail;
    int busy, stop, failed;
    uint64_t marked; /* last marker passed */
    unsigned rnd;
} fstream;

static void *engine(void *arg)
{
    fstream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->cv, &s->mu);
        if (!s->head)
            break;
        item *it = s->head;
        s->head = it->next;
        if (!s->head)
            s->tail = NULL;
        s->busy = 1;
        pthread_mutex_unlock(&s->mu);
        if (!it->mark) {
            s->rnd = s->rnd * 1103515245u + 12345u;
            if ((s->rnd >> 16) % 4 == 0) { /* late, as DMA is */
                struct timespec ts = {0, 50000};
                nanosleep(&ts, NULL);
            } else {
                sched_yield();
            }
            for (size_t i = 0; i < it->n && !it->fail; i++)
                memcpy(it->p[i].dst, it->p[i].src, it->p[i].len);
        }
        pthread_mutex_lock(&s->mu);
        if (it->fail)
            s->failed = 1;
        if (it->mark)
            s->marked = it->mark;
        s->busy = 0;
        pthread_cond_broadcast(&s->cv);
        kvp_free(it);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void *fake_stream_new(kvp_gpu_dev *dev)
{
    if (should_fail("stream"))
        return NULL;
    fstream *s = kvp_calloc(1, sizeof *s);
    if (!s)
        return NULL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->rnd = (unsigned)(uintptr_t)s;
    if (pthread_create(&s->th, NULL, engine, s) != 0) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        kvp_free(s);
        return NULL;
    }
    pthread_mutex_lock(&f_mu);
    f_stats.streams++;
    pthread_mutex_unlock(&f_mu);
    return s;
}

static int fake_drain(void *bs)
{
    fstream *s = bs;
    pthread_mutex_lock(&s->mu);
    while (s->head || s->busy)
        pthread_cond_wait(&s->cv, &s->mu);
    int failed = s->failed;
    pthread_mutex_unlock(&s->mu);
    return failed ? -1 : 0;
}

static void fake_stream_free(void *bs)
{
    fstream *s = bs;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->th, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    kvp_free(s);
}

static int fake_bind(kvp_gpu_dev *dev) { return 0; }

static void push(fstream *s, item *it)
{
    pthread_mutex_lock(&s->mu);
    if (s->tail)
        s->tail->next = it;
    else
        s->head = it;
    s->tail = it;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static int fake_copy(void *bs, int dir, const kvp_gpu_piece *p, size_t n)
{
    if (should_fail("copy"))
        return KVP_EDEVICE;
    item *it = kvp_calloc(1, sizeof *it + n * sizeof *p);
    if (!it)
        return KVP_EDEVICE;
    it->fail = should_fail("wait");
    pthread_mutex_lock(&f_mu);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const void *dside = dir == KVP_GPU_D2H ? p[i].src : p[i].dst;
        const void *hside = dir == KVP_GPU_D2H ? p[i].dst : p[i].src;
        uint8_t *sh = shadow_of(dside, p[i].len, NULL);
        if (!sh || shadow_of(hside, 1, NULL)) { /* device side not device, or host side not host */
            rc = KVP_EDEVICE;
            break;
        }
        if (!is_pinned(hside, p[i].len))
            f_stats.pageable++;
        it->p[i] = dir == KVP_GPU_D2H ? (kvp_gpu_piece){p[i].dst, sh, p[i].len}
                                      : (kvp_gpu_piece){sh, p[i].src, p[i].len};
    }
    if (rc == 0) {
        f_stats.copies += n;
        f_stats.copy_calls++;
    }
    pthread_mutex_unlock(&f_mu);
    if (rc) {
        kvp_free(it);
        return rc;
    }
    it->n = n;
    push(bs, it);
    return 0;
}

static int fake_mark(void *bs, uint64_t t)
{
    item *it = kvp_calloc(1, sizeof *it);
    if (!it)
        return KVP_EDEVICE;
    it->mark = t;
    push(bs, it);
    return 0;
}

static int fake_done(void *bs, uint64_t t)
{
    fstream *s = bs;
    pthread_mutex_lock(&s->mu);
    int r = s->failed ? -1 : s->marked >= t ? 0 : 1;
    pthread_mutex_unlock(&s->mu);
    return r;
}

/* ------------------------------------------------------------ memory */

static void *fake_dev_alloc(int ordinal, size_t len)
{
    if (ordinal != 0)
        return NULL;
    len = (len + 4095) & ~(size_t)4095;
    int fd = memfd_create("kvpool-fake-gpu", MFD_CLOEXEC);
    if (fd < 0)
        return NULL;
    void *d = MAP_FAILED, *s = MAP_FAILED;
    if (ftruncate(fd, (off_t)len) == 0) {
        d = mmap(NULL, len, PROT_NONE, MAP_SHARED | MAP_NORESERVE, fd, 0);
        s = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    }
    close(fd);
    pthread_mutex_lock(&f_mu);
    int slot = -1;
    for (int i = 0; i < MAX_ALLOCS && slot < 0; i++)
        if (!f_allocs[i].dview)
            slot = i;
    if (slot >= 0 && d != MAP_FAILED && s != MAP_FAILED)
        f_allocs[slot] = (falloc){d, s, len};
    pthread_mutex_unlock(&f_mu);
    if (slot < 0 || d == MAP_FAILED || s == MAP_FAILED) {
        if (d != MAP_FAILED)
            munmap(d, len);
        if (s != MAP_FAILED)
            munmap(s, len);
        return NULL;
    }
    return d;
}

static void fake_dev_free(void *p)
{
    pthread_mutex_lock(&f_mu);
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (f_allocs[i].dview == p) {
            munmap(f_allocs[i].dview, f_allocs[i].len);
            munmap(f_allocs[i].shadow, f_allocs[i].len);
            f_allocs[i] = (falloc){0};
        }
    pthread_mutex_unlock(&f_mu);
}

static int fake_memcpy(void *dst, const void *src, size_t len)
{
    pthread_mutex_lock(&f_mu);
    int pd = 0, ps = 0;
    uint8_t *d = shadow_of(dst, len, &pd), *s = shadow_of(src, len, &ps);
    pthread_mutex_unlock(&f_mu);
    if (pd || ps)
        return KVP_EDEVICE;
    memcpy(d ? d : dst, s ? s : src, len);
    return 0;
}

static void *fake_host_alloc(size_t len)
{
    if (should_fail("stage"))
        return NULL;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    if (add_reg(p, len, 1) != 0) {
        munmap(p, len);
        return NULL;
    }
    return p;
}

static void fake_host_free(void *p)
{
    int owned = 0;
    size_t len = del_reg(p, &owned);
    if (len && owned)
        munmap(p, len);
}

static const char *fake_copy_mode(void) { return "fake"; }

static const kvp_gpu_backend fake_backend = {
    "fake",          fake_classify,  fake_host_register, fake_host_unregister,
    fake_stream_new, fake_stream_free, fake_bind,        fake_copy,
    fake_mark,       fake_done,      fake_drain,         fake_dev_alloc,
    fake_dev_free,   fake_memcpy,    fake_host_alloc,    fake_host_free,
    fake_copy_mode,
};

const kvp_gpu_backend *kvp_gpu_fake_open(void) { return &fake_backend; }
