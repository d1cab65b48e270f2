/*
 * gpu_cuda.c -- the CUDA backend of gpu.h: the driver API loaded with
 * dlopen("libcuda.so.1"); nothing here links against CUDA, and the types
 * below are the driver ABI's (CUresult int, handles pointers, CUdeviceptr
 * 64-bit), declared here so that the library builds without CUDA headers.
 *
 * Devices: a pointer's context (CU_POINTER_ATTRIBUTE_CONTEXT, else its
 * device's primary context) names a kvp_gpu_dev; a job makes it current on
 * its thread before any stream work (threads are per batch).
 *
 * Copies (KVPOOL_GPU_COPY, read once):
 *   batch   cuMemcpyBatchAsync (_v2 of CUDA 13, or 12.8's form), one call
 *           per up to 1024 pieces
 *   kernel  the gather kernel (gpu_kernel.cu, PTX in gpu_kernel_ptx.c)
 *           over a tile table written into a page-locked arena of the
 *           stream; host sides must be page-locked and device-mapped (the
 *           segment and staging are); other pieces go one call each
 *   each    cuMemcpyDtoHAsync / cuMemcpyHtoDAsync per piece
 *   auto    batch when the driver has it, else kernel, else each
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/gpu_backend.h"
#include "common/log.h"
#include "common/mem.h"
#include "kvpool.h"

#define MOD "gpu"

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext, *CUstream, *CUevent, *CUmodule, *CUfunction;
typedef unsigned long long CUdeviceptr;
typedef struct {
    int type, id;
} cu_loc;
typedef struct {
    int src_access_order;
    cu_loc src_hint, dst_hint;
    unsigned flags;
} cu_memcpy_attrs;

enum {
    CU_OK = 0,
    CU_NOT_READY = 600,
    ATTR_CONTEXT = 1,
    ATTR_MEMORY_TYPE = 2,
    ATTR_DEVICE_ORDINAL = 9,
    ATTR_RANGE_START = 11,
    ATTR_RANGE_SIZE = 12,
    MEMTYPE_HOST = 1,
    HOSTREG_PORTABLE_DEVICEMAP = 0x1 | 0x2,
    STREAM_NON_BLOCKING = 0x1,
    EVENT_DISABLE_TIMING = 0x2,
    SRC_ACCESS_ORDER_STREAM = 0x1,
    LOC_DEVICE = 0x1,
    LOC_HOST = 0x2,
};

#define TILE (64u << 10)     /* kernel: bytes per tile (KVP_GPU_TILE) */
#define ARENA (1u << 20)     /* kernel: tile-table arena per stream */
#define BATCH_MAX 1024       /* batch: pieces per driver call */

static struct {
    CUresult (*Init)(unsigned);
    CUresult (*DriverGetVersion)(int *);
    CUresult (*GetErrorString)(CUresult, const char **);
    CUresult (*PointerGetAttribute)(void *, int, CUdeviceptr);
    CUresult (*CtxGetCurrent)(CUcontext *);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*MemHostRegister)(void *, size_t, unsigned);
    CUresult (*MemHostUnregister)(void *);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*EventCreate)(CUevent *, unsigned);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventQuery)(CUevent);
    CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*MemcpyBatch2)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, cu_memcpy_attrs *,
                             size_t *, size_t, CUstream);
    CUresult (*MemcpyBatch1)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, cu_memcpy_attrs *,
                             size_t *, size_t, size_t *, CUstream);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*Memcpy)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*MemHostAlloc)(void **, size_t, unsigned);
    CUresult (*MemFreeHost)(void *);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void **, void **);
} cu;

extern const char kvp_gpu_kernel_ptx[];

enum { COPY_BATCH, COPY_KERNEL, COPY_EACH };
static int c_mode = COPY_EACH; /* atomic: lowered once when the driver refuses a mode */
static CUfunction c_kernel;    /* loaded at open (in c_kernel_ctx): the mode's probe */
static CUcontext c_kernel_ctx;

struct kvp_gpu_dev {
    CUcontext ctx;
    int ordinal;
    int kernel_tried;  /* under c_mu */
    CUfunction kernel; /* the gather kernel in ctx (a module is its context's), or NULL */
};
#define MAX_DEVS 64
static pthread_mutex_t c_mu = PTHREAD_MUTEX_INITIALIZER;
static struct kvp_gpu_dev c_devs[MAX_DEVS];
static size_t c_ndevs;

/* Host ranges page-locked and device-mapped here (the kernel may reach
 * them), under c_mu. */
#define MAX_REGS 4096
static struct {
    uintptr_t base;
    size_t len;
} c_regs[MAX_REGS];
static size_t c_nregs;

static const char *cu_err(CUresult r)
{
    const char *s = NULL;
    if (cu.GetErrorString && cu.GetErrorString(r, &s) == CU_OK && s)
        return s;
    return "unknown CUDA error";
}

#define CU_CHECK(call, what)                                                                   \
    do {                                                                                       \
        CUresult r_ = (call);                                                                  \
        if (r_ != CU_OK) {                                                                     \
            KVP_WARN_LIMITED(MOD, "%s: %s (%d)", what, cu_err(r_), r_);                        \
            return KVP_EDEVICE;                                                                \
        }                                                                                      \
    } while (0)

/* ------------------------------------------------------------ devices */

/* The kvp_gpu_dev of ctx (ordinal for a new one), or NULL when full. */
static kvp_gpu_dev *dev_of(CUcontext ctx, int ordinal)
{
    pthread_mutex_lock(&c_mu);
    kvp_gpu_dev *d = NULL;
    for (size_t i = 0; i < c_ndevs && !d; i++)
        if (c_devs[i].ctx == ctx)
            d = &c_devs[i];
    if (!d && c_ndevs < MAX_DEVS) {
        d = &c_devs[c_ndevs++];
        d->ctx = ctx;
        d->ordinal = ordinal;
    }
    pthread_mutex_unlock(&c_mu);
    return d;
}

static CUcontext primary_ctx(int ordinal)
{
    CUdevice dev;
    CUcontext ctx = NULL;
    if (cu.DeviceGet(&dev, ordinal) != CU_OK || cu.PrimaryCtxRetain(&ctx, dev) != CU_OK)
        return NULL;
    return ctx;
}

/* A context current on this thread (the primary one of device 0 if none). */
static int ensure_ctx(void)
{
    CUcontext cur = NULL;
    if (cu.CtxGetCurrent(&cur) == CU_OK && cur)
        return 0;
    CUcontext p = primary_ctx(0);
    if (!p)
        return KVP_EDEVICE;
    CU_CHECK(cu.CtxSetCurrent(p), "cuCtxSetCurrent");
    return 0;
}

static int cuda_classify(const void *p, size_t len, kvp_gpu_dev **dev)
{
    if (ensure_ctx() != 0)
        return KVP_EDEVICE;
    CUdeviceptr a = (CUdeviceptr)(uintptr_t)p;
    unsigned mt = 0;
    if (cu.PointerGetAttribute(&mt, ATTR_MEMORY_TYPE, a) != CU_OK || mt == MEMTYPE_HOST)
        return 0; /* not CUDA's, or (registered) host memory */
    CUcontext ctx = NULL;
    CUdeviceptr start = 0;
    size_t size = 0;
    int ordinal = 0;
    CU_CHECK(cu.PointerGetAttribute(&start, ATTR_RANGE_START, a), "range of a device pointer");
    CU_CHECK(cu.PointerGetAttribute(&size, ATTR_RANGE_SIZE, a), "range of a device pointer");
    CU_CHECK(cu.PointerGetAttribute(&ordinal, ATTR_DEVICE_ORDINAL, a), "device of a pointer");
    if (cu.PointerGetAttribute(&ctx, ATTR_CONTEXT, a) != CU_OK || !ctx)
        ctx = primary_ctx(ordinal); /* VMM / pool allocations carry no context */
    if (a - start > size || len > size - (a - start)) {
        KVP_WARN_LIMITED(MOD, "device range %p + %zu crosses the end of its allocation", p, len);
        return KVP_EINVALID_PARAMS;
    }
    if (!ctx || !(*dev = dev_of(ctx, ordinal)))
        return KVP_EDEVICE;
    return 1;
}

static int cuda_bind(kvp_gpu_dev *d)
{
    CU_CHECK(cu.CtxSetCurrent(d->ctx), "cuCtxSetCurrent");
    return 0;
}

/* ------------------------------------------------------------- memory */

static void reg_add(void *p, size_t len)
{
    pthread_mutex_lock(&c_mu);
    if (c_nregs < MAX_REGS) {
        c_regs[c_nregs].base = (uintptr_t)p;
        c_regs[c_nregs++].len = len;
    }
    pthread_mutex_unlock(&c_mu);
}

static void reg_del(void *p)
{
    pthread_mutex_lock(&c_mu);
    for (size_t i = 0; i < c_nregs; i++)
        if (c_regs[i].base == (uintptr_t)p) {
            c_regs[i] = c_regs[--c_nregs];
            break;
        }
    pthread_mutex_unlock(&c_mu);
}

/* 1 when [p, p+len) was page-locked and device-mapped here. */
static int reg_has(const void *p, size_t len)
{
    uintptr_t a = (uintptr_t)p;
    int r = 0;
    pthread_mutex_lock(&c_mu);
    for (size_t i = 0; i < c_nregs && !r; i++)
        r = a >= c_regs[i].base && len <= c_regs[i].len && a - c_regs[i].base <= c_regs[i].len - len;
    pthread_mutex_unlock(&c_mu);
    return r;
}

static int cuda_host_register(void *p, size_t len)
{
    if (ensure_ctx() != 0)
        return KVP_EDEVICE;
    CU_CHECK(cu.MemHostRegister(p, len, HOSTREG_PORTABLE_DEVICEMAP), "cuMemHostRegister");
    reg_add(p, len);
    return 0;
}

static void cuda_host_unregister(void *p)
{
    reg_del(p);
    if (ensure_ctx() == 0)
        cu.MemHostUnregister(p);
}

static void *cuda_host_alloc(size_t len)
{
    void *p = NULL;
    if (ensure_ctx() != 0 || cu.MemHostAlloc(&p, len, HOSTREG_PORTABLE_DEVICEMAP) != CU_OK)
        return NULL;
    reg_add(p, len);
    return p;
}

static void cuda_host_free(void *p)
{
    reg_del(p);
    cu.MemFreeHost(p);
}

static void *cuda_dev_alloc(int ordinal, size_t len)
{
    CUcontext ctx = primary_ctx(ordinal);
    CUdeviceptr d = 0;
    if (!ctx || cu.CtxSetCurrent(ctx) != CU_OK || cu.MemAlloc(&d, len) != CU_OK)
        return NULL;
    return (void *)(uintptr_t)d;
}

static void cuda_dev_free(void *p)
{
    if (ensure_ctx() == 0)
        cu.MemFree((CUdeviceptr)(uintptr_t)p);
}

static int cuda_memcpy(void *dst, const void *src, size_t len)
{
    if (ensure_ctx() != 0)
        return KVP_EDEVICE;
    CU_CHECK(cu.Memcpy((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, len), "cuMemcpy");
    return 0;
}

/* ------------------------------------------------------------ streams */

typedef struct cstream {
    CUstream st;
    kvp_gpu_dev *dev;
    int ordinal;         /* its device's */
    CUevent ev[KVP_GPU_TICKETS];
    uint8_t *arena;      /* kernel mode: tile tables (page-locked, mapped) */
    size_t arena_used;
} cstream;

static void *cuda_stream_new(kvp_gpu_dev *d)
{
    if (cuda_bind(d) != 0)
        return NULL;
    cstream *s = kvp_calloc(1, sizeof *s);
    if (!s)
        return NULL;
    if (cu.StreamCreate(&s->st, STREAM_NON_BLOCKING) != CU_OK) {
        kvp_free(s);
        return NULL;
    }
    s->dev = d;
    s->ordinal = d->ordinal;
    return s;
}

static int cuda_drain(void *bs)
{
    cstream *s = bs;
    CUresult r = cu.StreamSynchronize(s->st);
    if (r != CU_OK)
        KVP_WARN_LIMITED(MOD, "cuStreamSynchronize: %s (%d)", cu_err(r), r);
    s->arena_used = 0;
    return r == CU_OK ? 0 : -1;
}

static void cuda_stream_free(void *bs)
{
    cstream *s = bs;
    cuda_drain(s);
    for (int i = 0; i < KVP_GPU_TICKETS; i++)
        if (s->ev[i])
            cu.EventDestroy(s->ev[i]);
    if (s->arena)
        cuda_host_free(s->arena);
    cu.StreamDestroy(s->st);
    kvp_free(s);
}

static int cuda_mark(void *bs, uint64_t t)
{
    cstream *s = bs;
    CUevent *e = &s->ev[t % KVP_GPU_TICKETS];
    if (!*e)
        CU_CHECK(cu.EventCreate(e, EVENT_DISABLE_TIMING), "cuEventCreate");
    CU_CHECK(cu.EventRecord(*e, s->st), "cuEventRecord");
    return 0;
}

static int cuda_done(void *bs, uint64_t t)
{
    cstream *s = bs;
    CUresult r = cu.EventQuery(s->ev[t % KVP_GPU_TICKETS]);
    if (r == CU_OK)
        return 0;
    if (r == CU_NOT_READY)
        return 1;
    KVP_WARN_LIMITED(MOD, "a copy failed on the stream: %s (%d)", cu_err(r), r);
    return -1;
}

static int copy_one(cstream *s, int dir, const kvp_gpu_piece *p)
{
    if (dir == KVP_GPU_D2H)
        CU_CHECK(cu.MemcpyDtoHAsync(p->dst, (CUdeviceptr)(uintptr_t)p->src, p->len, s->st),
                 "cuMemcpyDtoHAsync");
    else
        CU_CHECK(cu.MemcpyHtoDAsync((CUdeviceptr)(uintptr_t)p->dst, p->src, p->len, s->st),
                 "cuMemcpyHtoDAsync");
    return 0;
}

/* A call refused for what it is (not supported, not permitted, invalid
 * here, no code for this GPU), as opposed to a failure of the device or of
 * the copy (the sticky 7xx errors, out of memory): only a refusal lowers
 * the copy mode. */
static int refused(CUresult r)
{
    return r == 1 || r == 98 || r == 200 || r == 209 || r == 218 || r == 222 || r == 400 ||
           r == 500 || r == 701 || r == 800 || r == 801;
}

/* Batch mode: one cuMemcpyBatchAsync per up to BATCH_MAX pieces. 0,
 * KVP_ENOT_SUPPORTED (the driver refuses the call), or KVP_EDEVICE. */
static int copy_batch(cstream *s, int dir, const kvp_gpu_piece *p, size_t n)
{
    CUdeviceptr dst[BATCH_MAX], src[BATCH_MAX];
    size_t len[BATCH_MAX], zero = 0, fail = 0;
    cu_loc dev = {LOC_DEVICE, s->ordinal}, host = {LOC_HOST, 0};
    cu_memcpy_attrs at = {SRC_ACCESS_ORDER_STREAM, dir == KVP_GPU_D2H ? dev : host,
                          dir == KVP_GPU_D2H ? host : dev, 0};
    for (size_t o = 0; o < n; o += BATCH_MAX) {
        size_t m = n - o < BATCH_MAX ? n - o : BATCH_MAX;
        for (size_t i = 0; i < m; i++) {
            dst[i] = (CUdeviceptr)(uintptr_t)p[o + i].dst;
            src[i] = (CUdeviceptr)(uintptr_t)p[o + i].src;
            len[i] = p[o + i].len;
        }
        if (m == 1) {
            if (copy_one(s, dir, &p[o]) != 0)
                return KVP_EDEVICE;
            continue;
        }
        CUresult r = cu.MemcpyBatch2
                         ? cu.MemcpyBatch2(dst, src, len, m, &at, &zero, 1, s->st)
                         : cu.MemcpyBatch1(dst, src, len, m, &at, &zero, 1, &fail, s->st);
        if (r != CU_OK) {
            KVP_WARN_LIMITED(MOD, "cuMemcpyBatchAsync: %s (%d)", cu_err(r), r);
            return refused(r) ? KVP_ENOT_SUPPORTED : KVP_EDEVICE;
        }
    }
    return 0;
}

/* The gather kernel of s's device, loaded in its context (current on this
 * thread) at the first need; NULL when it does not load there. */
static CUfunction dev_kernel(cstream *s)
{
    kvp_gpu_dev *d = s->dev;
    pthread_mutex_lock(&c_mu);
    if (!d->kernel_tried) {
        CUmodule m;
        d->kernel_tried = 1;
        if (d->ctx == c_kernel_ctx)
            d->kernel = c_kernel;
        else if (cu.ModuleLoadData(&m, kvp_gpu_kernel_ptx) != CU_OK ||
                 cu.ModuleGetFunction(&d->kernel, m, "kvp_gpu_gather") != CU_OK)
            d->kernel = NULL;
    }
    CUfunction f = d->kernel;
    pthread_mutex_unlock(&c_mu);
    return f;
}

typedef struct tile {
    unsigned long long dst, src, len;
} tile;

/* Kernel mode: tiles into the stream's arena (a fresh lap after a drain
 * when full: earlier launches may still read their tables), one launch per
 * lap. Pieces whose host side the kernel cannot reach, or too large for
 * the arena, go one call each. */
static int copy_kernel(cstream *s, int dir, const kvp_gpu_piece *p, size_t n)
{
    CUfunction fn = dev_kernel(s);
    if (!fn || (!s->arena && !(s->arena = cuda_host_alloc(ARENA))))
        return KVP_ENOT_SUPPORTED;
    size_t cap = ARENA / sizeof(tile), i = 0;
    while (i < n) {
        if (cap - s->arena_used < 64)
            cuda_drain(s);
        tile *t = (tile *)s->arena + s->arena_used;
        size_t nt = 0, room = cap - s->arena_used;
        while (i < n) {
            const void *host = dir == KVP_GPU_D2H ? p[i].dst : p[i].src;
            size_t tiles = (p[i].len + TILE - 1) / TILE;
            if (!reg_has(host, p[i].len) || tiles > cap) {
                if (copy_one(s, dir, &p[i++]) != 0)
                    return KVP_EDEVICE;
                continue;
            }
            if (tiles > room - nt)
                break;
            for (size_t k = 0; k < tiles; k++) {
                size_t off = k * (size_t)TILE;
                t[nt++] = (tile){(uintptr_t)p[i].dst + off, (uintptr_t)p[i].src + off,
                                 p[i].len - off < TILE ? p[i].len - off : TILE};
            }
            i++;
        }
        if (nt) {
            CUdeviceptr tp = (CUdeviceptr)(uintptr_t)t;
            unsigned un = (unsigned)nt;
            void *args[] = {&tp, &un};
            unsigned grid = un < 1024 ? un : 1024;
            CUresult r = cu.LaunchKernel(fn, grid, 1, 1, 256, 1, 1, 0, s->st, args, NULL);
            if (r != CU_OK) {
                KVP_WARN_LIMITED(MOD, "cuLaunchKernel: %s (%d)", cu_err(r), r);
                return refused(r) ? KVP_ENOT_SUPPORTED : KVP_EDEVICE;
            }
            s->arena_used += nt;
        } else if (i < n) {
            cuda_drain(s); /* the next piece needs a fresh lap */
        }
    }
    return 0;
}

/* Copies in the process's mode. A batch or kernel call the driver refuses
 * (an older or restricted driver: refused()) moves the process to the next
 * mode for good, with a warning, and all n pieces go again that way:
 * copies of the same bytes to the same place that were enqueued before the
 * refusal are harmless repeats. Any other failure is KVP_EDEVICE for the
 * caller's op, the mode unchanged. */
static int cuda_copy(void *bs, int dir, const kvp_gpu_piece *p, size_t n)
{
    cstream *s = bs;
    int mode = __atomic_load_n(&c_mode, __ATOMIC_RELAXED), rc = 0;
    if (mode == COPY_BATCH && (rc = copy_batch(s, dir, p, n)) != KVP_ENOT_SUPPORTED)
        return rc;
    if (mode == COPY_BATCH) {
        mode = c_kernel ? COPY_KERNEL : COPY_EACH;
        __atomic_store_n(&c_mode, mode, __ATOMIC_RELAXED);
        KVP_WARN(MOD, "cuMemcpyBatchAsync refused; copies go %s from now on",
                 mode == COPY_KERNEL ? "by the gather kernel" : "one call per piece");
    }
    if (mode == COPY_KERNEL && (rc = copy_kernel(s, dir, p, n)) != KVP_ENOT_SUPPORTED)
        return rc;
    if (mode == COPY_KERNEL) {
        __atomic_store_n(&c_mode, COPY_EACH, __ATOMIC_RELAXED);
        KVP_WARN(MOD, "the gather kernel was refused; copies go one call per piece from now on");
    }
    for (size_t i = 0; i < n; i++)
        if (copy_one(s, dir, &p[i]) != 0)
            return KVP_EDEVICE;
    return 0;
}

static const char *cuda_copy_mode(void)
{
    return c_mode == COPY_BATCH ? "batch" : c_mode == COPY_KERNEL ? "kernel" : "each";
}

static const kvp_gpu_backend cuda_backend = {
    "cuda",          cuda_classify,    cuda_host_register, cuda_host_unregister,
    cuda_stream_new, cuda_stream_free, cuda_bind,          cuda_copy,
    cuda_mark,       cuda_done,        cuda_drain,         cuda_dev_alloc,
    cuda_dev_free,   cuda_memcpy,      cuda_host_alloc,    cuda_host_free,
    cuda_copy_mode,
};

/* ---------------------------------------------------------------- load */

#define SYM(field, name)                                                                       \
    do {                                                                                       \
        *(void **)&cu.field = dlsym(h, name);                                                  \
        if (!cu.field) {                                                                       \
            snprintf(why, whylen, "libcuda.so.1 lacks %s (driver too old)", name);             \
            return NULL;                                                                       \
        }                                                                                      \
    } while (0)

/* The kernel, when the driver can compile its PTX. */
static void load_kernel(void)
{
    CUmodule m;
    if (ensure_ctx() == 0 && cu.CtxGetCurrent(&c_kernel_ctx) == CU_OK &&
        cu.ModuleLoadData(&m, kvp_gpu_kernel_ptx) == CU_OK &&
        cu.ModuleGetFunction(&c_kernel, m, "kvp_gpu_gather") == CU_OK)
        return;
    c_kernel = NULL;
}

static void choose_copy_mode(void)
{
    const char *e = getenv("KVPOOL_GPU_COPY");
    int want = !e || !*e || !strcmp(e, "auto") ? -1
               : !strcmp(e, "batch")           ? COPY_BATCH
               : !strcmp(e, "kernel")          ? COPY_KERNEL
               : !strcmp(e, "each")            ? COPY_EACH
                                               : -2;
    if (want == -2)
        KVP_WARN(MOD, "KVPOOL_GPU_COPY=%s: not one of auto, batch, kernel, each; using auto", e);
    int have_batch = cu.MemcpyBatch2 || cu.MemcpyBatch1;
    if (want == COPY_KERNEL || want < 0)
        load_kernel(); /* auto: also what a refused batch falls back to */
    if (want == COPY_BATCH && !have_batch)
        KVP_WARN(MOD, "KVPOOL_GPU_COPY=batch: the driver has no cuMemcpyBatchAsync; using each");
    if (want == COPY_KERNEL && !c_kernel)
        KVP_WARN(MOD, "KVPOOL_GPU_COPY=kernel: the kernel did not load; using each");
    c_mode = (want == COPY_BATCH || want < 0) && have_batch ? COPY_BATCH
             : (want == COPY_KERNEL || want < 0) && c_kernel ? COPY_KERNEL
                                                            : COPY_EACH;
}

const kvp_gpu_backend *kvp_gpu_cuda_open(int force, char *why, size_t whylen)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!h && !force)
        return NULL; /* no device pointer can exist in this process yet */
    if (!h)
        h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, whylen, "libcuda.so.1 cannot be loaded (%s)", dlerror());
        return NULL;
    }
    SYM(Init, "cuInit");
    SYM(DriverGetVersion, "cuDriverGetVersion");
    SYM(GetErrorString, "cuGetErrorString");
    SYM(PointerGetAttribute, "cuPointerGetAttribute");
    SYM(CtxGetCurrent, "cuCtxGetCurrent");
    SYM(CtxSetCurrent, "cuCtxSetCurrent");
    SYM(DeviceGet, "cuDeviceGet");
    SYM(DeviceGetCount, "cuDeviceGetCount");
    SYM(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    SYM(MemHostRegister, "cuMemHostRegister_v2");
    SYM(MemHostUnregister, "cuMemHostUnregister");
    SYM(StreamCreate, "cuStreamCreate");
    SYM(StreamDestroy, "cuStreamDestroy_v2");
    SYM(StreamSynchronize, "cuStreamSynchronize");
    SYM(EventCreate, "cuEventCreate");
    SYM(EventDestroy, "cuEventDestroy_v2");
    SYM(EventRecord, "cuEventRecord");
    SYM(EventQuery, "cuEventQuery");
    SYM(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
    SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
    SYM(MemAlloc, "cuMemAlloc_v2");
    SYM(MemFree, "cuMemFree_v2");
    SYM(Memcpy, "cuMemcpy");
    SYM(MemHostAlloc, "cuMemHostAlloc");
    SYM(MemFreeHost, "cuMemFreeHost");
    SYM(ModuleLoadData, "cuModuleLoadData");
    SYM(ModuleGetFunction, "cuModuleGetFunction");
    SYM(LaunchKernel, "cuLaunchKernel");
    *(void **)&cu.MemcpyBatch2 = dlsym(h, "cuMemcpyBatchAsync_v2");
    if (!cu.MemcpyBatch2)
        *(void **)&cu.MemcpyBatch1 = dlsym(h, "cuMemcpyBatchAsync");
    CUresult r = cu.Init(0);
    int ndev = 0, ver = 0;
    if (r == CU_OK)
        r = cu.DeviceGetCount(&ndev);
    if (r != CU_OK || ndev == 0) {
        snprintf(why, whylen, "cuInit: %s", r != CU_OK ? cu_err(r) : "no CUDA device");
        return NULL;
    }
    cu.DriverGetVersion(&ver);
    choose_copy_mode();
    snprintf(why, whylen, "driver %d.%d, %d device%s, copies: %s", ver / 1000, ver % 1000 / 10,
             ndev, ndev == 1 ? "" : "s", cuda_copy_mode());
    return &cuda_backend;
}
