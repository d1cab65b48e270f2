/*
 * libcuda_mock.c -- a stand-in libcuda.so.1 for tests: the driver API calls
 * the CUDA backend (src/client/gpu_cuda.c) resolves, behaving like a GPU
 * closely enough that the backend's real code paths run on a CPU-only
 * machine (`make test-cuda-mock`, and `make test` through
 * build/asan/tests/test_cuda_mock; tests/cuda_mock.sh runs test_gpu once
 * per copy mode).
 *
 * Built as build/cuda-mock/libcuda.so.1 (found through LD_LIBRARY_PATH),
 * exporting only the driver's entry points gpu_cuda.c looks up, plus
 * kvp_cuda_mock_stats(). When cuda.h is available the definitions below are
 * checked against its prototypes by the compiler, and the constants and
 * struct layouts gpu_cuda.c declares by hand are checked against it (the
 * static asserts after the includes). Built with -DKVP_CUDA_MOCK_DRIVER=12080
 * it is a CUDA 12.8 driver instead: cuMemcpyBatchAsync of 12.8 (with
 * failIdx) instead of cuMemcpyBatchAsync_v2, and PTX up to ISA 8.7 only.
 *
 * Model (like the driver, strict where the driver is):
 *  - cuInit first (else CUDA_ERROR_NOT_INITIALIZED); KVP_CUDA_MOCK_DEVICES
 *    devices (default 1), each with a primary context; the current context
 *    is per thread. Calls that work "in the current context" (allocation,
 *    registration, stream / event creation, module loading, copies,
 *    launches) fail with CUDA_ERROR_INVALID_CONTEXT without one; calls on
 *    a handle (stream sync, event query, frees) use the handle's, and with
 *    KVP_CUDA_MOCK_STRICT=1 require a current context too.
 *  - Device memory (cuMemAlloc) is a memfd mapped twice: PROT_NONE at the
 *    address handed out, so a CPU access faults as on a GPU, and read-write
 *    elsewhere for the mock's own copies. cuPointerGetAttribute knows it
 *    (MEMORY_TYPE DEVICE, CONTEXT, DEVICE_ORDINAL, RANGE_START_ADDR,
 *    RANGE_SIZE), and page-locked host memory (cuMemHostRegister,
 *    cuMemHostAlloc: MEMORY_TYPE HOST); any other pointer is
 *    CUDA_ERROR_INVALID_VALUE. Registering a range twice, or memory that is
 *    not mapped read-write, fails as it does on the driver.
 *  - Streams are asynchronous: one thread per stream executes copies, event
 *    records and kernels in order, each a little late (a yield, sometimes a
 *    sleep), so a missing wait shows as wrong bytes. Events are NOT_READY
 *    until their record is reached. A fault on a stream (a kernel touching
 *    memory it cannot reach, a copy into freed memory) is sticky: the rest
 *    of the stream is dropped and its syncs and event queries report
 *    CUDA_ERROR_ILLEGAL_ADDRESS. cuMemFree / cuMemFreeHost /
 *    cuMemHostUnregister wait for the work enqueued before them (as the
 *    driver's implicit synchronisation does).
 *  - cuMemcpyBatchAsync validates its attributes (numAttrs, attrsIdxs,
 *    srcAccessOrder, flags, location hints) and runs the batch on the
 *    stream; KVP_CUDA_MOCK_NO_BATCH=1 makes it return
 *    CUDA_ERROR_NOT_SUPPORTED (a driver that refuses batches).
 *  - cuModuleLoadData takes the PTX text of gpu_kernel.cu (".entry
 *    kvp_gpu_gather"; its .version checked against the driver's);
 *    cuLaunchKernel of kvp_gpu_gather interprets its parameters (a table of
 *    {u64 dst, u64 src, u64 len} tiles, a u32 count) on the stream thread:
 *    the table and every host side must lie in page-locked, device-mapped
 *    memory (registered with DEVICEMAP, or cuMemHostAlloc'd with DEVICEMAP),
 *    else the stream faults. KVP_CUDA_MOCK_NO_KERNEL=1: the PTX does not
 *    load; KVP_CUDA_MOCK_LAUNCH_FAIL=1: launches are refused
 *    (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES).
 *  - cuMemcpy is synchronous, any direction (it waits for blocking streams,
 *    as the legacy default stream does; gpu_cuda.c's are non-blocking).
 *  - The NULL (legacy) stream is not modelled: async calls on it are
 *    refused with CUDA_ERROR_NOT_SUPPORTED and a message.
 *  - Every error returned is also written to stderr ("kvp-cuda-mock: ..."),
 *    the first 64 of a process. KVP_CUDA_MOCK_STATS=FILE appends one line of
 *    counters per process at exit (tests/cuda_mock.sh checks them).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef KVP_CUDA_MOCK_DRIVER
#define KVP_CUDA_MOCK_DRIVER 13000
#endif

#if __has_include(<cuda.h>)
#include <cuda.h>
#define MOCK_CUDA_H 1
#else
/* The subset of cuda.h (CUDA 13.0) used here, same names and values. */
#define MOCK_CUDA_H 0
#define CUDAAPI
typedef enum cudaError_enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_PTX = 218,
    CUDA_ERROR_JIT_COMPILER_NOT_FOUND = 221,
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_UNKNOWN = 999
} CUresult;
typedef unsigned long long CUdeviceptr;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUevent_st *CUevent;
typedef struct CUstream_st *CUstream;
typedef enum CUpointer_attribute_enum {
    CU_POINTER_ATTRIBUTE_CONTEXT = 1,
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,
    CU_POINTER_ATTRIBUTE_HOST_POINTER = 4,
    CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
    CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
    CU_POINTER_ATTRIBUTE_MAPPED = 13,
} CUpointer_attribute;
typedef enum CUmemorytype_enum { CU_MEMORYTYPE_HOST = 1, CU_MEMORYTYPE_DEVICE = 2 } CUmemorytype;
#define CU_MEMHOSTALLOC_PORTABLE 0x01
#define CU_MEMHOSTALLOC_DEVICEMAP 0x02
#define CU_MEMHOSTALLOC_WRITECOMBINED 0x04
#define CU_MEMHOSTREGISTER_PORTABLE 0x01
#define CU_MEMHOSTREGISTER_DEVICEMAP 0x02
#define CU_MEMHOSTREGISTER_IOMEMORY 0x04
#define CU_MEMHOSTREGISTER_READ_ONLY 0x08
enum { CU_STREAM_DEFAULT = 0, CU_STREAM_NON_BLOCKING = 1 };
enum { CU_EVENT_DEFAULT = 0, CU_EVENT_BLOCKING_SYNC = 1, CU_EVENT_DISABLE_TIMING = 2,
       CU_EVENT_INTERPROCESS = 4 };
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
typedef enum CUmemLocationType_enum {
    CU_MEM_LOCATION_TYPE_INVALID = 0,
    CU_MEM_LOCATION_TYPE_DEVICE = 1,
    CU_MEM_LOCATION_TYPE_HOST = 2,
    CU_MEM_LOCATION_TYPE_HOST_NUMA = 3,
    CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT = 4,
} CUmemLocationType;
typedef struct CUmemLocation_st {
    CUmemLocationType type;
    int id;
} CUmemLocation;
typedef enum CUmemcpySrcAccessOrder_enum {
    CU_MEMCPY_SRC_ACCESS_ORDER_INVALID = 0,
    CU_MEMCPY_SRC_ACCESS_ORDER_STREAM = 1,
    CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL = 2,
    CU_MEMCPY_SRC_ACCESS_ORDER_ANY = 3,
} CUmemcpySrcAccessOrder;
enum { CU_MEMCPY_FLAG_DEFAULT = 0, CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE = 1 };
typedef struct CUmemcpyAttributes_st {
    CUmemcpySrcAccessOrder srcAccessOrder;
    CUmemLocation srcLocHint;
    CUmemLocation dstLocHint;
    unsigned int flags;
} CUmemcpyAttributes;
#endif

/* ------------------------------------------ the ABI gpu_cuda.c assumes */

/* gpu_cuda.c declares the driver ABI by hand (typedef int CUresult, handles
 * as void *, CUdeviceptr unsigned long long, cu_loc / cu_memcpy_attrs, an
 * enum of constants); these are its values and layouts, checked against
 * cuda.h when it is there (else against the subset above). */
typedef struct {
    int type, id;
} gc_cu_loc;
typedef struct {
    int src_access_order;
    gc_cu_loc src_hint, dst_hint;
    unsigned flags;
} gc_cu_memcpy_attrs;
#define SA(c) _Static_assert(c, #c)
SA(sizeof(CUresult) == sizeof(int));
SA(sizeof(CUdevice) == sizeof(int));
SA(sizeof(CUdeviceptr) == sizeof(unsigned long long));
SA(sizeof(CUpointer_attribute) == sizeof(int));
SA(CUDA_SUCCESS == 0);
SA(CUDA_ERROR_NOT_READY == 600);
SA(CU_POINTER_ATTRIBUTE_CONTEXT == 1);
SA(CU_POINTER_ATTRIBUTE_MEMORY_TYPE == 2);
SA(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL == 9);
SA(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR == 11);
SA(CU_POINTER_ATTRIBUTE_RANGE_SIZE == 12);
SA(CU_MEMORYTYPE_HOST == 1);
SA((CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP) == (0x1 | 0x2));
SA((CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP) == (0x1 | 0x2));
SA(CU_STREAM_NON_BLOCKING == 0x1);
SA(CU_EVENT_DISABLE_TIMING == 0x2);
SA(CU_MEMCPY_SRC_ACCESS_ORDER_STREAM == 0x1);
SA(CU_MEM_LOCATION_TYPE_DEVICE == 0x1);
SA(CU_MEM_LOCATION_TYPE_HOST == 0x2);
SA(sizeof(CUmemLocation) == sizeof(gc_cu_loc));
SA(offsetof(CUmemLocation, type) == offsetof(gc_cu_loc, type));
SA(offsetof(CUmemLocation, id) == offsetof(gc_cu_loc, id));
SA(sizeof(CUmemcpyAttributes) == sizeof(gc_cu_memcpy_attrs));
SA(offsetof(CUmemcpyAttributes, srcAccessOrder) == offsetof(gc_cu_memcpy_attrs, src_access_order));
SA(offsetof(CUmemcpyAttributes, srcLocHint) == offsetof(gc_cu_memcpy_attrs, src_hint));
SA(offsetof(CUmemcpyAttributes, dstLocHint) == offsetof(gc_cu_memcpy_attrs, dst_hint));
SA(offsetof(CUmemcpyAttributes, flags) == offsetof(gc_cu_memcpy_attrs, flags));
/* the gather kernel's tile (gpu_kernel.cu, gpu_cuda.c's `tile`) */
typedef struct {
    unsigned long long dst, src, len;
} mock_tile;
SA(sizeof(mock_tile) == 24);

#define API __attribute__((visibility("default")))

/* ------------------------------------------------------------ state */

#define MAX_DEVS 8
#define MAX_ALLOCS 4096
#define MAX_HOST 4096
#define MAX_STREAMS 4096 /* slots are never reused: a destroyed handle stays invalid */
#define MAX_EVENTS 131072
#define MAX_MODULES 64
#define MAGIC_CTX 0x6b637478u
#define MAGIC_MOD 0x6b6d6f64u
#define MAGIC_FN 0x6b66756eu

struct CUctx_st {
    unsigned magic;
    int ordinal;
    unsigned retained;
};

struct CUmod_st {
    unsigned magic;
    CUcontext ctx;
    int has_gather;
};

struct CUfunc_st {
    unsigned magic;
    CUmodule mod;
};

typedef struct mitem mitem;

struct CUstream_st {
    int used;     /* under g_mu; 2: destroyed */
    CUcontext ctx;
    unsigned flags;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    mitem *head, *tail;
    uint64_t enq, done; /* items enqueued / finished (executed or dropped) */
    int stop;
    CUresult err; /* sticky (atomic reads) */
    unsigned rnd;
};

struct CUevent_st {
    int used; /* under g_ev_mu; 2: destroyed, slot kept until its records pass */
    CUcontext ctx;
    unsigned flags;
    CUstream st;       /* of its latest record */
    uint64_t recorded; /* generation of the latest record */
    uint64_t reached;  /* latest generation executed */
    int pending;       /* records enqueued, not yet executed */
};

typedef struct dalloc {
    uintptr_t base; /* PROT_NONE: the device address */
    size_t len;     /* as requested */
    size_t maplen;  /* page-rounded */
    uint8_t *rw;    /* the mock's view */
    CUcontext ctx;
} dalloc;

typedef struct hmem {
    uintptr_t base;
    size_t len;
    unsigned flags;
    int alloc; /* cuMemHostAlloc'd (else registered) */
    CUcontext ctx;
} hmem;

enum { IT_COPY, IT_RECORD, IT_KERNEL };

typedef struct mcopy {
    unsigned long long dst, src;
    size_t len;
} mcopy;

struct mitem {
    mitem *next;
    int kind;
    const char *what; /* the call that enqueued it */
    CUevent ev;       /* IT_RECORD */
    uint64_t gen;
    unsigned long long table; /* IT_KERNEL */
    unsigned ntiles;
    size_t n; /* IT_COPY */
    mcopy c[];
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_rwlock_t g_mem = PTHREAD_RWLOCK_INITIALIZER; /* g_allocs, g_host */
static pthread_mutex_t g_ev_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_inited, g_ndevs = 1, g_strict, g_no_batch, g_no_kernel, g_launch_fail;
static struct CUctx_st g_ctx[MAX_DEVS];
static __thread CUcontext t_cur;
static dalloc g_allocs[MAX_ALLOCS];
static hmem g_host[MAX_HOST];
static struct CUstream_st g_streams[MAX_STREAMS];
static size_t g_nstreams;
static struct CUevent_st g_events[MAX_EVENTS];
static size_t g_nevents;
static struct CUmod_st g_mods[MAX_MODULES];
static struct CUfunc_st g_fns[MAX_MODULES];
static size_t g_nmods;

/* Counters (kvp_cuda_mock_stats); `size` first so that callers built
 * against another version can tell. */
typedef struct kvp_cuda_mock_counters {
    uint64_t size;
    uint64_t allocs, frees;                  /* cuMemAlloc / cuMemFree */
    uint64_t registers, unregisters;         /* cuMemHostRegister / Unregister */
    uint64_t host_allocs, host_frees;        /* cuMemHostAlloc / cuMemFreeHost */
    uint64_t streams, events;                /* created */
    uint64_t async_copies;                   /* cuMemcpy{DtoH,HtoD}Async calls */
    uint64_t batch_calls, batch_copies;      /* cuMemcpyBatchAsync accepted, their copies */
    uint64_t batch_refused;                  /* KVP_CUDA_MOCK_NO_BATCH refusals */
    uint64_t modules, launches, tiles;       /* modules loaded, kernel launches, their tiles */
    uint64_t launch_refused;                 /* KVP_CUDA_MOCK_LAUNCH_FAIL refusals */
    uint64_t sync_copies;                    /* cuMemcpy */
    uint64_t pageable;                       /* async copies whose host side is not page-locked */
    uint64_t bytes;                          /* bytes copied by the streams */
    uint64_t errors;                         /* error results returned (NOT_READY not counted) */
    uint64_t no_context;                     /* calls made with no current context */
    uint64_t faults;                         /* streams that faulted (sticky errors) */
} kvp_cuda_mock_counters;
static kvp_cuda_mock_counters g_st;
#define COUNT(f, n) __atomic_fetch_add(&g_st.f, (uint64_t)(n), __ATOMIC_RELAXED)

API void kvp_cuda_mock_stats(kvp_cuda_mock_counters *out);
void kvp_cuda_mock_stats(kvp_cuda_mock_counters *out)
{
    kvp_cuda_mock_counters s;
    memset(&s, 0, sizeof s);
    uint64_t *src = &g_st.allocs, *dst = &s.allocs;
    for (size_t i = 0; i < (sizeof s - sizeof s.size) / sizeof(uint64_t); i++)
        dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
    s.size = sizeof s;
    *out = s;
}

/* ------------------------------------------------------------ errors */

static const struct {
    CUresult r;
    const char *name, *text;
} k_errs[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
     "PTX JIT compiler library not found"},
    {CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
     "the provided PTX was compiled with an unsupported toolchain."},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
     "too many resources requested for launch"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static const char *err_name(CUresult r)
{
    for (size_t i = 0; i < sizeof k_errs / sizeof *k_errs; i++)
        if (k_errs[i].r == r)
            return k_errs[i].name;
    return "CUDA_ERROR_?";
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    static int said;
    if (__atomic_fetch_add(&said, 1, __ATOMIC_RELAXED) >= 64)
        return;
    char b[512];
    int n = snprintf(b, sizeof b, "kvp-cuda-mock[%d]: ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b + n, sizeof b - (size_t)n, fmt, ap);
    va_end(ap);
    size_t l = strlen(b);
    if (l < sizeof b - 1)
        b[l++] = '\n';
    ssize_t w = write(2, b, l);
    (void)w;
}

/* Returns r, saying why (an error of fn). */
#define FAIL(r, fmt, ...) fail_(r, __func__, fmt, ##__VA_ARGS__)
static CUresult fail_(CUresult r, const char *fn, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static CUresult fail_(CUresult r, const char *fn, const char *fmt, ...)
{
    char b[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    COUNT(errors, 1);
    say("%s: %s (%d): %s", fn, err_name(r), (int)r, b);
    return r;
}

#define NEED_INIT()                                                                            \
    do {                                                                                       \
        if (!__atomic_load_n(&g_inited, __ATOMIC_ACQUIRE))                                     \
            return FAIL(CUDA_ERROR_NOT_INITIALIZED, "cuInit has not been called");             \
    } while (0)

/* A call working in the current context: one must be current. */
#define NEED_CTX()                                                                             \
    do {                                                                                       \
        NEED_INIT();                                                                           \
        if (!t_cur) {                                                                          \
            COUNT(no_context, 1);                                                              \
            return FAIL(CUDA_ERROR_INVALID_CONTEXT, "no context is current on this thread");   \
        }                                                                                      \
    } while (0)

/* A call on a handle: the handle's context; KVP_CUDA_MOCK_STRICT=1 wants a
 * current one anyway. */
#define HANDLE_CTX()                                                                           \
    do {                                                                                       \
        NEED_INIT();                                                                           \
        if (!t_cur) {                                                                          \
            COUNT(no_context, 1);                                                              \
            if (g_strict)                                                                      \
                return FAIL(CUDA_ERROR_INVALID_CONTEXT,                                        \
                            "no context is current on this thread (KVP_CUDA_MOCK_STRICT)");    \
        }                                                                                      \
    } while (0)

/* ------------------------------------------------------------ memory */

/* Caller holds g_mem. The allocation holding [a, a+len) (*partial: one
 * that holds a but not all of it), or NULL. */
static dalloc *dev_find(uintptr_t a, size_t len, int *partial)
{
    for (size_t i = 0; i < MAX_ALLOCS; i++) {
        dalloc *d = &g_allocs[i];
        if (!d->base || a < d->base || a - d->base >= d->len)
            continue;
        if (len > d->len - (a - d->base)) {
            if (partial)
                *partial = 1;
            return NULL;
        }
        return d;
    }
    return NULL;
}

/* Caller holds g_mem. 1 when [a, a+len) overlaps device memory. */
static int dev_overlaps(uintptr_t a, size_t len)
{
    for (size_t i = 0; i < MAX_ALLOCS; i++) {
        dalloc *d = &g_allocs[i];
        if (d->base && a < d->base + d->maplen && d->base < a + len)
            return 1;
    }
    return 0;
}

/* Caller holds g_mem. The page-locked host range holding [a, a+len). */
static hmem *host_find(uintptr_t a, size_t len)
{
    for (size_t i = 0; i < MAX_HOST; i++) {
        hmem *h = &g_host[i];
        if (h->base && a >= h->base && len <= h->len && a - h->base <= h->len - len)
            return h;
    }
    return NULL;
}

static hmem *host_overlap(uintptr_t a, size_t len)
{
    for (size_t i = 0; i < MAX_HOST; i++) {
        hmem *h = &g_host[i];
        if (h->base && a < h->base + h->len && h->base < a + len)
            return h;
    }
    return NULL;
}

/* 1 when [p, p+len) lies in mappings readable (and writable unless ro). */
static int host_mapped(uintptr_t p, size_t len, int ro)
{
    uintptr_t cur = p, end = p + len;
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f)
        return 0;
    char line[512];
    while (cur < end && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perms[8];
        size_t l = strlen(line);
        if (l && line[l - 1] != '\n') {
            char more[512];
            while (fgets(more, sizeof more, f) && !strchr(more, '\n'))
                ;
        }
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 || hi <= cur)
            continue;
        if (lo > cur || perms[0] != 'r' || (!ro && perms[1] != 'w'))
            break;
        cur = hi;
    }
    fclose(f);
    return cur >= end;
}

/* Where the copy engine reads or writes [a, a+len): the mock's view of
 * device memory, or a itself (host memory). kernel: only memory a kernel
 * can reach (device memory, device-mapped page-locked host memory).
 * NULL: neither. */
static uint8_t *engine_addr(unsigned long long a, size_t len, int kernel, int *pinned)
{
    uint8_t *r = NULL;
    pthread_rwlock_rdlock(&g_mem);
    dalloc *d = dev_find((uintptr_t)a, len, NULL);
    if (d) {
        r = d->rw + ((uintptr_t)a - d->base);
    } else if (!dev_overlaps((uintptr_t)a, len ? len : 1)) {
        hmem *h = host_find((uintptr_t)a, len);
        if (pinned)
            *pinned = h != NULL;
        if (!kernel || (h && (h->flags & CU_MEMHOSTREGISTER_DEVICEMAP)))
            r = (uint8_t *)(uintptr_t)a;
    }
    pthread_rwlock_unlock(&g_mem);
    return r;
}

/* ------------------------------------------------------------ streams */

/* 1 when handle h is the address of one of the n slots of size sz at base. */
static int slot_of(const void *h, const void *base, size_t n, size_t sz)
{
    uintptr_t a = (uintptr_t)h, b = (uintptr_t)base;
    return a >= b && a < b + n * sz && (a - b) % sz == 0;
}

static int stream_ok(CUstream s)
{
    return slot_of(s, g_streams, MAX_STREAMS, sizeof *s) &&
           __atomic_load_n(&s->used, __ATOMIC_ACQUIRE) == 1;
}

static int event_ok_locked(CUevent e)
{
    return slot_of(e, g_events, MAX_EVENTS, sizeof *e) && e->used == 1;
}

static CUresult check_stream(CUstream s, const char *fn)
{
    if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
        return fail_(CUDA_ERROR_NOT_SUPPORTED, fn,
                     "the NULL / legacy / per-thread stream is not modelled by the mock");
    if (!stream_ok(s))
        return fail_(CUDA_ERROR_INVALID_HANDLE, fn, "stream %p is not a live stream", (void *)s);
    return CUDA_SUCCESS;
}

static void stream_fault(CUstream s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void stream_fault(CUstream s, const char *fmt, ...)
{
    char b[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    COUNT(faults, 1);
    say("stream %p faults: CUDA_ERROR_ILLEGAL_ADDRESS: %s (later work on it is dropped)",
        (void *)s, b);
    __atomic_store_n(&s->err, CUDA_ERROR_ILLEGAL_ADDRESS, __ATOMIC_RELEASE);
}

/* Executes one copy or kernel item on stream s; 0, or -1 (s faulted). */
static int run_item(CUstream s, mitem *it)
{
    if (it->kind == IT_COPY) {
        for (size_t i = 0; i < it->n; i++) {
            mcopy *c = &it->c[i];
            uint8_t *d = engine_addr(c->dst, c->len, 0, NULL);
            uint8_t *r = engine_addr(c->src, c->len, 0, NULL);
            if (!d || !r) {
                stream_fault(s, "%s: copy %zu of %zu: %s %#llx + %zu is no longer memory it "
                                "can reach (freed?)",
                             it->what, i, it->n, !d ? "dst" : "src", !d ? c->dst : c->src, c->len);
                return -1;
            }
            memcpy(d, r, c->len);
            COUNT(bytes, c->len);
        }
        return 0;
    }
    /* IT_KERNEL: kvp_gpu_gather(const tile *t, unsigned n), every block */
    size_t tb = (size_t)it->ntiles * sizeof(mock_tile);
    const uint8_t *tt = it->ntiles ? engine_addr(it->table, tb, 1, NULL) : NULL;
    if (it->ntiles && !tt) {
        stream_fault(s, "kvp_gpu_gather: its tile table %#llx + %zu is neither device memory nor "
                        "page-locked device-mapped host memory", it->table, tb);
        return -1;
    }
    for (unsigned i = 0; i < it->ntiles; i++) {
        mock_tile q;
        memcpy(&q, tt + (size_t)i * sizeof q, sizeof q); /* read as the kernel runs */
        uint8_t *d = engine_addr(q.dst, (size_t)q.len, 1, NULL);
        uint8_t *r = engine_addr(q.src, (size_t)q.len, 1, NULL);
        if (!d || !r) {
            stream_fault(s, "kvp_gpu_gather: tile %u of %u: %s %#llx + %llu is neither device "
                            "memory nor page-locked device-mapped host memory",
                         i, it->ntiles, !d ? "dst" : "src", !d ? q.dst : q.src, q.len);
            return -1;
        }
        memcpy(d, r, (size_t)q.len);
        COUNT(bytes, q.len);
    }
    return 0;
}

static void *stream_main(void *arg)
{
    CUstream s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->cv, &s->mu);
        if (!s->head)
            break;
        mitem *it = s->head;
        s->head = it->next;
        if (!s->head)
            s->tail = NULL;
        pthread_mutex_unlock(&s->mu);
        int failed = __atomic_load_n(&s->err, __ATOMIC_ACQUIRE) != CUDA_SUCCESS;
        if (it->kind == IT_RECORD) {
            pthread_mutex_lock(&g_ev_mu);
            CUevent e = it->ev;
            if (!failed && it->gen > e->reached)
                e->reached = it->gen;
            if (--e->pending == 0 && e->used == 2)
                e->used = 3; /* destroyed, nothing pending: gone */
            pthread_mutex_unlock(&g_ev_mu);
        } else if (!failed) {
            s->rnd = s->rnd * 1103515245u + 12345u;
            if ((s->rnd >> 16) % 4 == 0) { /* late, as DMA is */
                struct timespec ts = {0, 50000};
                nanosleep(&ts, NULL);
            } else {
                sched_yield();
            }
            run_item(s, it);
        }
        free(it);
        pthread_mutex_lock(&s->mu);
        s->done++;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void push(CUstream s, mitem *it)
{
    pthread_mutex_lock(&s->mu);
    if (s->tail)
        s->tail->next = it;
    else
        s->head = it;
    s->tail = it;
    s->enq++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Waits until the work enqueued on s before now is finished. */
static void stream_wait(CUstream s)
{
    pthread_mutex_lock(&s->mu);
    uint64_t upto = s->enq;
    while (s->done < upto)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

/* Waits for the work enqueued on every stream (blocking_only: on streams
 * created without CU_STREAM_NON_BLOCKING) before now. */
static void streams_wait(int blocking_only)
{
    pthread_mutex_lock(&g_mu);
    size_t n = g_nstreams;
    pthread_mutex_unlock(&g_mu);
    for (size_t i = 0; i < n; i++) {
        CUstream s = &g_streams[i];
        if (__atomic_load_n(&s->used, __ATOMIC_ACQUIRE) == 1 &&
            (!blocking_only || !(s->flags & CU_STREAM_NON_BLOCKING)))
            stream_wait(s); /* mu and cv live on after a destroy */
    }
}

static mitem *item_new(int kind, size_t n, const char *what)
{
    mitem *it = calloc(1, sizeof *it + n * sizeof(mcopy));
    if (it) {
        it->kind = kind;
        it->n = n;
        it->what = what;
    }
    return it;
}

/* ------------------------------------------------------ init, devices */

API CUresult CUDAAPI cuInit(unsigned int Flags)
{
    if (Flags != 0)
        return FAIL(CUDA_ERROR_INVALID_VALUE, "Flags %u (must be 0)", Flags);
    pthread_mutex_lock(&g_mu);
    if (!g_inited) {
        const char *e = getenv("KVP_CUDA_MOCK_DEVICES");
        int n = e && *e ? atoi(e) : 1;
        g_ndevs = n < 0 ? 0 : n > MAX_DEVS ? MAX_DEVS : n;
        for (int i = 0; i < MAX_DEVS; i++)
            g_ctx[i] = (struct CUctx_st){MAGIC_CTX, i, 0};
        g_strict = (e = getenv("KVP_CUDA_MOCK_STRICT")) && *e == '1';
        g_no_batch = (e = getenv("KVP_CUDA_MOCK_NO_BATCH")) && *e == '1';
        g_no_kernel = (e = getenv("KVP_CUDA_MOCK_NO_KERNEL")) && *e == '1';
        g_launch_fail = (e = getenv("KVP_CUDA_MOCK_LAUNCH_FAIL")) && *e == '1';
        __atomic_store_n(&g_inited, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_mu);
    if (g_ndevs == 0)
        return FAIL(CUDA_ERROR_NO_DEVICE, "KVP_CUDA_MOCK_DEVICES=0");
    return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return FAIL(CUDA_ERROR_INVALID_VALUE, "driverVersion is NULL");
    *driverVersion = KVP_CUDA_MOCK_DRIVER;
    return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof k_errs / sizeof *k_errs; i++)
        if (k_errs[i].r == error) {
            *pStr = k_errs[i].text;
            return CUDA_SUCCESS;
        }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

API CUresult CUDAAPI cuDeviceGetCount(int *count)
{
    NEED_INIT();
    if (!count)
        return FAIL(CUDA_ERROR_INVALID_VALUE, "count is NULL");
    *count = g_ndevs;
    return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal)
{
    NEED_INIT();
    if (!device)
        return FAIL(CUDA_ERROR_INVALID_VALUE, "device is NULL");
    if (ordinal < 0 || ordinal >= g_ndevs)
        return FAIL(CUDA_ERROR_INVALID_DEVICE, "ordinal %d (%d devices)", ordinal, g_ndevs);
    *device = ordinal;
    return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    NEED_INIT();
    if (!pctx)
        return FAIL(CUDA_ERROR_INVALID_VALUE, "pctx is NULL");
    if (dev < 0 || dev >= g_ndevs)
        return FAIL(CUDA_ERROR_INVALID_DEVICE, "device %d (%d devices)", dev, g_ndevs);
    __atomic_fetch_add(&g_ctx[dev].retained, 1, __ATOMIC_RELAXED);
    *pctx = &g_ctx[dev];
    return CUDA_SUCCESS;
}

static int ctx_ok(CUcontext c)
{
    return slot_of(c, g_ctx, (size_t)g_ndevs, sizeof *c) && c->magic == MAGIC_CTX;
}

API CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
    NEED_INIT();
    if (!pctx)
        return FAIL(CUDA_ERROR_INVALID_VALUE, "pctx is NULL");
    *pctx = t_cur;
    return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
    NEED_INIT();
    if (ctx && !ctx_ok(ctx))
        return FAIL(CUDA_ERROR_INVALID_CONTEXT, "%p is not a context", (void *)ctx);
    t_cur = ctx;
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------- pointer queries */

API CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute,
                                           CUdeviceptr ptr)
{
    HANDLE_CTX();
    if (!data)
        return FAIL(CUDA_ERROR_INVALID_VALUE, "data is NULL");
    uintptr_t a = (uintptr_t)ptr;
    int dev = 0;
    uintptr_t start = 0;
    size_t size = 0;
    CUcontext ctx = NULL;
    pthread_rwlock_rdlock(&g_mem);
    dalloc *d = dev_find(a, 1, NULL);
    hmem *h = d ? NULL : host_find(a, 1);
    if (d) {
        dev = 1;
        start = d->base;
        size = d->len;
        ctx = d->ctx;
    } else if (h) {
        start = h->base;
        size = h->len;
        ctx = h->ctx;
    }
    pthread_rwlock_unlock(&g_mem);
    if (!d && !h)
        return CUDA_ERROR_INVALID_VALUE; /* memory CUDA does not know: expected, not said */
    switch ((int)attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = ctx;
        break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = dev ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = ptr; /* unified addressing */
        break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (dev)
            return FAIL(CUDA_ERROR_INVALID_VALUE, "HOST_POINTER of device memory %#llx", ptr);
        *(void **)data = (void *)a;
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(int *)data = 0;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = ctx->ordinal;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = start;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = size;
        break;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(int *)data = 1;
        break;
    default:
        return FAIL(CUDA_ERROR_INVALID_VALUE, "attribute %d is not modelled", (int)attribute);
    }
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------ device memory */

#if MOCK_CUDA_H
#undef cuMemAlloc
#endif
API CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    NEED_CTX();
    if (!dptr || bytesize == 0)
        return FAIL(CUDA_ERROR_INVALID_VALUE, "dptr %p, bytesize %zu", (void *)dptr, bytesize);
    size_t ml = (bytesize + 4095) & ~(size_t)4095;
    int fd = memfd_create("kvp-cuda-mock", MFD_CLOEXEC);
    if (fd < 0)
        return FAIL(CUDA_ERROR_OUT_OF_MEMORY, "memfd_create: %s", strerror(errno));
    void *dv = MAP_FAILED, *rw = MAP_FAILED;
    if (ftruncate(fd, (off_t)ml) == 0) {
        dv = mmap(NULL, ml, PROT_NONE, MAP_SHARED | MAP_NORESERVE, fd, 0);
        rw = mmap(NULL, ml, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    }
    close(fd);
    int slot = -1;
    pthread_rwlock_wrlock(&g_mem);
    for (int i = 0; i < MAX_ALLOCS && slot < 0; i++)
        if (!g_allocs[i].base)
            slot = i;
    if (slot >= 0 && dv != MAP_FAILED && rw != MAP_FAILED)
        g_allocs[slot] = (dalloc){(uintptr_t)dv, bytesize, ml, rw, t_cur};
    pthread_rwlock_unlock(&g_mem);
    if (slot < 0 || dv == MAP_FAILED || rw == MAP_FAILED) {
        if (dv != MAP_FAILED)
            munmap(dv, ml);
        if (rw != MAP_FAILED)
            munmap(rw, ml);
        return FAIL(CUDA_ERROR_OUT_OF_MEMORY, "%zu bytes", bytesize);
    }
    COUNT(allocs, 1);
    *dptr = (CUdeviceptr)(uintptr_t)dv;
    return CUDA_SUCCESS;
}

#if MOCK_CUDA_H
#undef cuMemFree
#endif
API CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr)
{
    HANDLE_CTX();
    if (!dptr)
        return CUDA_SUCCESS;
    streams_wait(0); /* the driver synchronises before freeing */
    pthread_rwlock_wrlock(&g_mem);
    dalloc *d = NULL;
    for (size_t i = 0; i < MAX_ALLOCS && !d; i++)
        if (g_allocs[i].base == (uintptr_t)dptr)
            d = &g_allocs[i];
    dalloc copy = d ? *d : (dalloc){0};
    if (d)
        *d = (dalloc){0};
    pthread_rwlock_unlock(&g_mem);
    if (!d)
        return FAIL(CUDA_ERROR_INVALID_VALUE, "%#llx is not the start of an allocation", dptr);
    munmap((void *)copy.base, copy.maplen);
    munmap(copy.rw, copy.maplen);
    COUNT(frees, 1);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------ page-locked host memory */

static CUresult host_add(const char *fn, void *p, size_t len, unsigned flags, int alloc)
{
    CUresult r = CUDA_SUCCESS;
    pthread_rwlock_wrlock(&g_mem);
    hmem *o = host_overlap((uintptr_t)p, len);
    int slot = -1;
    for (int i = 0; i < MAX_HOST && slot < 0 && !o; i++)
        if (!g_host[i].base)
            slot = i;
    if (o)
        r = fail_(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, fn,
                  "%p + %zu overlaps the page-locked range %p + %zu", p, len, (void *)o->base,
                  o->len);
    else if (dev_overlaps((uintptr_t)p, len))
        r = fail_(CUDA_ERROR_INVALID_VALUE, fn, "%p + %zu is device memory", p, len);
    else if (slot < 0)
        r = fail_(CUDA_ERROR_OUT_OF_MEMORY, fn, "too many page-locked ranges");
    else
        g_host[slot] = (hmem){(uintptr_t)p, len, flags, alloc, t_cur};
    pthread_rwlock_unlock(&g_mem);
    return r;
}

/* Removes the page-locked range starting at p (alloc: a cuMemHostAlloc
 * one, else a registration): its length, 0 when none. */
static size_t host_del(void *p, int alloc)
{
    size_t len = 0;
    pthread_rwlock_wrlock(&g_mem);
    for (size_t i = 0; i < MAX_HOST; i++)
        if (g_host[i].base && g_host[i].base == (uintptr_t)p && g_host[i].alloc == alloc) {
            len = g_host[i].len;
            g_host[i] = (hmem){0};
            break;
        }
    pthread_rwlock_unlock(&g_mem);
    return len;
}

#if MOCK_CUDA_H
#undef cuMemHostRegister
#endif
API CUresult CUDAAPI cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    NEED_CTX();
    if (!p || bytesize == 0 || (Flags & ~0xfu))
        return FAIL(CUDA_ERROR_INVALID_VALUE, "p %p, bytesize %zu, Flags %#x", p, bytesize, Flags);
    if ((uintptr_t)p + bytesize < (uintptr_t)p ||
        !host_mapped((uintptr_t)p, bytesize, !!(Flags & CU_MEMHOSTREGISTER_READ_ONLY)))
        return FAIL(CUDA_ERROR_INVALID_VALUE, "%p + %zu is not host memory mapped %s", p,
                    bytesize, Flags & CU_MEMHOSTREGISTER_READ_ONLY ? "readable" : "read-write");
    CUresult r = host_add(__func__, p, bytesize, Flags, 0);
    if (r == CUDA_SUCCESS)
        COUNT(registers, 1);
    return r;
}

API CUresult CUDAAPI cuMemHostUnregister(void *p)
{
    NEED_CTX();
    streams_wait(0);
    if (!p || !host_del(p, 0))
        return FAIL(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "%p is not the start of a registration",
                    p);
    COUNT(unregisters, 1);
    return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    NEED_CTX();
    if (!pp || bytesize == 0 || (Flags & ~0x7u))
        return FAIL(CUDA_ERROR_INVALID_VALUE, "pp %p, bytesize %zu, Flags %#x", (void *)pp,
                    bytesize, Flags);
    void *p = mmap(NULL, bytesize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return FAIL(CUDA_ERROR_OUT_OF_MEMORY, "%zu bytes: %s", bytesize, strerror(errno));
    /* the driver's flags: PORTABLE 1 and DEVICEMAP 2 share values with
     * cuMemHostRegister's; WRITECOMBINED (4) has no effect here */
    CUresult r = host_add(__func__, p, bytesize, Flags & (CU_MEMHOSTALLOC_PORTABLE |
                                                          CU_MEMHOSTALLOC_DEVICEMAP), 1);
    if (r != CUDA_SUCCESS) {
        munmap(p, bytesize);
        return r;
    }
    COUNT(host_allocs, 1);
    *pp = p;
    return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuMemFreeHost(void *p)
{
    HANDLE_CTX();
    streams_wait(0);
    size_t len = p ? host_del(p, 1) : 0;
    if (!len)
        return FAIL(CUDA_ERROR_INVALID_VALUE, "%p is not from cuMemHostAlloc", p);
    munmap(p, len);
    COUNT(host_frees, 1);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------ streams, events */

API CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    NEED_CTX();
    if (!phStream || (Flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return FAIL(CUDA_ERROR_INVALID_VALUE, "phStream %p, Flags %#x", (void *)phStream, Flags);
    pthread_mutex_lock(&g_mu);
    CUstream s = g_nstreams < MAX_STREAMS ? &g_streams[g_nstreams++] : NULL;
    pthread_mutex_unlock(&g_mu);
    if (!s)
        return FAIL(CUDA_ERROR_OUT_OF_MEMORY, "more than %d streams in this process", MAX_STREAMS);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->ctx = t_cur;
    s->flags = Flags;
    s->rnd = (unsigned)(uintptr_t)s;
    if (pthread_create(&s->th, NULL, stream_main, s) != 0)
        return FAIL(CUDA_ERROR_OUT_OF_MEMORY, "pthread_create failed");
    __atomic_store_n(&s->used, 1, __ATOMIC_RELEASE);
    COUNT(streams, 1);
    *phStream = s;
    return CUDA_SUCCESS;
}

#if MOCK_CUDA_H
#undef cuStreamDestroy
#endif
API CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream)
{
    HANDLE_CTX();
    CUresult r = check_stream(hStream, __func__);
    if (r != CUDA_SUCCESS)
        return r;
    __atomic_store_n(&hStream->used, 2, __ATOMIC_RELEASE);
    pthread_mutex_lock(&hStream->mu);
    hStream->stop = 1; /* its thread finishes what is queued, then ends */
    pthread_cond_broadcast(&hStream->cv);
    pthread_mutex_unlock(&hStream->mu);
    pthread_join(hStream->th, NULL);
    return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuStreamSynchronize(CUstream hStream)
{
    HANDLE_CTX();
    CUresult r = check_stream(hStream, __func__);
    if (r != CUDA_SUCCESS)
        return r;
    stream_wait(hStream);
    return __atomic_load_n(&hStream->err, __ATOMIC_ACQUIRE);
}

API CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    NEED_CTX();
    if (!phEvent || (Flags & ~0x7u))
        return FAIL(CUDA_ERROR_INVALID_VALUE, "phEvent %p, Flags %#x", (void *)phEvent, Flags);
    if ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING))
        return FAIL(CUDA_ERROR_INVALID_VALUE, "INTERPROCESS without DISABLE_TIMING");
    pthread_mutex_lock(&g_ev_mu);
    CUevent e = g_nevents < MAX_EVENTS ? &g_events[g_nevents++] : NULL;
    if (e)
        *e = (struct CUevent_st){1, t_cur, Flags, NULL, 0, 0, 0};
    pthread_mutex_unlock(&g_ev_mu);
    if (!e)
        return FAIL(CUDA_ERROR_OUT_OF_MEMORY, "more than %d events in this process", MAX_EVENTS);
    COUNT(events, 1);
    *phEvent = e;
    return CUDA_SUCCESS;
}

#if MOCK_CUDA_H
#undef cuEventDestroy
#endif
API CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent)
{
    HANDLE_CTX();
    pthread_mutex_lock(&g_ev_mu);
    int ok = event_ok_locked(hEvent);
    if (ok)
        hEvent->used = hEvent->pending ? 2 : 3; /* records still queued finish first */
    pthread_mutex_unlock(&g_ev_mu);
    if (!ok)
        return FAIL(CUDA_ERROR_INVALID_HANDLE, "event %p is not a live event", (void *)hEvent);
    return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream)
{
    HANDLE_CTX();
    CUresult r = check_stream(hStream, __func__);
    if (r != CUDA_SUCCESS)
        return r;
    mitem *it = item_new(IT_RECORD, 0, __func__);
    if (!it)
        return FAIL(CUDA_ERROR_OUT_OF_MEMORY, "no memory");
    pthread_mutex_lock(&g_ev_mu);
    int ok = event_ok_locked(hEvent) && hEvent->ctx == hStream->ctx;
    if (ok) {
        it->ev = hEvent;
        it->gen = ++hEvent->recorded;
        hEvent->st = hStream;
        hEvent->pending++;
    }
    pthread_mutex_unlock(&g_ev_mu);
    if (!ok) {
        free(it);
        return FAIL(CUDA_ERROR_INVALID_HANDLE,
                    "event %p is not a live event of the stream's context", (void *)hEvent);
    }
    push(hStream, it);
    return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuEventQuery(CUevent hEvent)
{
    NEED_INIT(); /* the driver needs no current context for this one */
    pthread_mutex_lock(&g_ev_mu);
    int ok = event_ok_locked(hEvent);
    CUresult r = CUDA_SUCCESS;
    if (ok && hEvent->st)
        r = __atomic_load_n(&hEvent->st->err, __ATOMIC_ACQUIRE);
    if (ok && r == CUDA_SUCCESS && hEvent->reached < hEvent->recorded)
        r = CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&g_ev_mu);
    if (!ok)
        return FAIL(CUDA_ERROR_INVALID_HANDLE, "event %p is not a live event", (void *)hEvent);
    return r;
}

/* ------------------------------------------------------------- copies */

/* Checks one copy of an async call; *pageable set when its host side is
 * not page-locked. dir: 'D' device->host, 'H' host->device, 0 either (UVA). */
static CUresult check_copy(const char *fn, unsigned long long dst, unsigned long long src,
                           size_t len, int dir, int *pageable)
{
    int pd = 0, ps = 0;
    pthread_rwlock_rdlock(&g_mem);
    dalloc *dd = dev_find((uintptr_t)dst, len ? len : 1, &pd);
    dalloc *ds = dev_find((uintptr_t)src, len ? len : 1, &ps);
    int hostpin = 1;
    if (!dd)
        hostpin = hostpin && host_find((uintptr_t)dst, len) != NULL;
    if (!ds)
        hostpin = hostpin && host_find((uintptr_t)src, len) != NULL;
    pthread_rwlock_unlock(&g_mem);
    if (pd || ps)
        return fail_(CUDA_ERROR_INVALID_VALUE, fn,
                     "%s %#llx + %zu crosses the end of its allocation", pd ? "dst" : "src",
                     pd ? dst : src, len);
    if (!dst || !src)
        return fail_(CUDA_ERROR_INVALID_VALUE, fn, "NULL %s", !dst ? "dst" : "src");
    if (dir == 'D' && (!ds || dd))
        return fail_(CUDA_ERROR_INVALID_VALUE, fn,
                     "device-to-host copy from %#llx (%s) to %#llx (%s)", src,
                     ds ? "device" : "not device memory", dst, dd ? "device memory" : "host");
    if (dir == 'H' && (!dd || ds))
        return fail_(CUDA_ERROR_INVALID_VALUE, fn,
                     "host-to-device copy from %#llx (%s) to %#llx (%s)", src,
                     ds ? "device memory" : "host", dst, dd ? "device" : "not device memory");
    if (!hostpin)
        *pageable = 1;
    return CUDA_SUCCESS;
}

static CUresult stream_of_ctx(CUstream s, const char *fn)
{
    CUresult r = check_stream(s, fn);
    if (r == CUDA_SUCCESS && s->ctx != t_cur)
        r = fail_(CUDA_ERROR_INVALID_HANDLE, fn, "stream %p belongs to another context", (void *)s);
    return r;
}

static CUresult async_copy(const char *fn, unsigned long long dst, unsigned long long src,
                           size_t len, int dir, CUstream s)
{
    NEED_CTX();
    CUresult r = stream_of_ctx(s, fn);
    int pageable = 0;
    if (r == CUDA_SUCCESS)
        r = check_copy(fn, dst, src, len, dir, &pageable);
    if (r != CUDA_SUCCESS)
        return r;
    mitem *it = item_new(IT_COPY, 1, fn);
    if (!it)
        return fail_(CUDA_ERROR_OUT_OF_MEMORY, fn, "no memory");
    it->c[0] = (mcopy){dst, src, len};
    COUNT(async_copies, 1);
    COUNT(pageable, pageable);
    push(s, it);
    return CUDA_SUCCESS;
}

#if MOCK_CUDA_H
#undef cuMemcpyDtoHAsync
#undef cuMemcpyHtoDAsync
#endif
API CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                          CUstream hStream)
{
    return async_copy(__func__, (uintptr_t)dstHost, srcDevice, ByteCount, 'D', hStream);
}

API CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost,
                                          size_t ByteCount, CUstream hStream)
{
    return async_copy(__func__, dstDevice, (uintptr_t)srcHost, ByteCount, 'H', hStream);
}

static CUresult batch(const char *fn, CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                      size_t count, CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs,
                      size_t *failIdx, CUstream hStream)
{
    NEED_INIT();
    if (failIdx)
        *failIdx = SIZE_MAX;
    if (g_no_batch) {
        COUNT(batch_refused, 1);
        return CUDA_ERROR_NOT_SUPPORTED; /* KVP_CUDA_MOCK_NO_BATCH: quietly, like a driver */
    }
    NEED_CTX();
    if (!hStream || hStream == CU_STREAM_LEGACY)
        return fail_(CUDA_ERROR_INVALID_VALUE, fn, "the legacy NULL stream is not allowed");
    CUresult r = stream_of_ctx(hStream, fn);
    if (r != CUDA_SUCCESS)
        return r;
    if (!dsts || !srcs || !sizes || count == 0 || !attrs || !attrsIdxs || numAttrs == 0 ||
        numAttrs > count)
        return fail_(CUDA_ERROR_INVALID_VALUE, fn,
                     "dsts %p srcs %p sizes %p count %zu attrs %p attrsIdxs %p numAttrs %zu",
                     (void *)dsts, (void *)srcs, (void *)sizes, count, (void *)attrs,
                     (void *)attrsIdxs, numAttrs);
    for (size_t k = 0; k < numAttrs; k++) {
        const CUmemcpyAttributes *a = &attrs[k];
        if (k == 0 ? attrsIdxs[0] != 0 : attrsIdxs[k] <= attrsIdxs[k - 1] || attrsIdxs[k] >= count)
            return fail_(CUDA_ERROR_INVALID_VALUE, fn, "attrsIdxs[%zu] = %zu (count %zu)", k,
                         attrsIdxs[k], count);
        if (a->srcAccessOrder < CU_MEMCPY_SRC_ACCESS_ORDER_STREAM ||
            a->srcAccessOrder > CU_MEMCPY_SRC_ACCESS_ORDER_ANY)
            return fail_(CUDA_ERROR_INVALID_VALUE, fn, "attrs[%zu].srcAccessOrder %d", k,
                         (int)a->srcAccessOrder);
        if (a->flags & ~(unsigned)CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE)
            return fail_(CUDA_ERROR_INVALID_VALUE, fn, "attrs[%zu].flags %#x", k, a->flags);
        const CUmemLocation *h[2] = {&a->srcLocHint, &a->dstLocHint};
        for (int i = 0; i < 2; i++)
            if ((int)h[i]->type < 0 || (int)h[i]->type > CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT ||
                (h[i]->type == CU_MEM_LOCATION_TYPE_DEVICE &&
                 (h[i]->id < 0 || h[i]->id >= g_ndevs)))
                return fail_(CUDA_ERROR_INVALID_VALUE, fn, "attrs[%zu].%sLocHint {%d, %d}", k,
                             i ? "dst" : "src", (int)h[i]->type, h[i]->id);
    }
    mitem *it = item_new(IT_COPY, count, fn);
    if (!it)
        return fail_(CUDA_ERROR_OUT_OF_MEMORY, fn, "no memory");
    uint64_t pageable = 0;
    for (size_t i = 0; i < count; i++) {
        int pg = 0;
        if ((r = check_copy(fn, dsts[i], srcs[i], sizes[i], 0, &pg)) != CUDA_SUCCESS) {
            free(it);
            if (failIdx)
                *failIdx = i;
            return r;
        }
        pageable += (uint64_t)pg;
        it->c[i] = (mcopy){dsts[i], srcs[i], sizes[i]};
    }
    COUNT(batch_calls, 1);
    COUNT(batch_copies, count);
    COUNT(pageable, pageable);
    push(hStream, it);
    return CUDA_SUCCESS;
}

#if MOCK_CUDA_H
#undef cuMemcpyBatchAsync
#endif
#if KVP_CUDA_MOCK_DRIVER >= 13000
API CUresult CUDAAPI cuMemcpyBatchAsync_v2(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                                           size_t count, CUmemcpyAttributes *attrs,
                                           size_t *attrsIdxs, size_t numAttrs, CUstream hStream)
{
    return batch(__func__, dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, NULL, hStream);
}
#else
/* CUDA 12.8 / 12.9: the first form, with failIdx */
API CUresult CUDAAPI cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                                        size_t count, CUmemcpyAttributes *attrs, size_t *attrsIdxs,
                                        size_t numAttrs, size_t *failIdx, CUstream hStream)
{
    if (!failIdx)
        return FAIL(CUDA_ERROR_INVALID_VALUE, "failIdx is NULL");
    return batch(__func__, dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, hStream);
}
#endif

API CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    NEED_CTX();
    if (ByteCount == 0)
        return CUDA_SUCCESS;
    int pg = 0;
    CUresult r = check_copy(__func__, dst, src, ByteCount, 0, &pg);
    if (r != CUDA_SUCCESS)
        return r;
    streams_wait(1); /* the legacy default stream waits for blocking streams */
    uint8_t *d = engine_addr(dst, ByteCount, 0, NULL), *s = engine_addr(src, ByteCount, 0, NULL);
    if (!d || !s)
        return FAIL(CUDA_ERROR_INVALID_VALUE, "%#llx <- %#llx + %zu", dst, src, ByteCount);
    memcpy(d, s, ByteCount);
    COUNT(sync_copies, 1);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------ modules, kernels */

/* The driver's newest PTX ISA version, times 10. */
static int ptx_isa_max(void)
{
    int v = KVP_CUDA_MOCK_DRIVER;
    return v >= 13000 ? 90 : v >= 12090 ? 88 : v >= 12080 ? 87 : v >= 12060 ? 85
           : v >= 12000 ? 80 + (v - 12000) / 10 : 78;
}

API CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image)
{
    NEED_CTX();
    if (!module || !image)
        return FAIL(CUDA_ERROR_INVALID_VALUE, "module %p image %p", (void *)module, image);
    if (g_no_kernel)
        return FAIL(CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "KVP_CUDA_MOCK_NO_KERNEL=1");
    const char *ptx = image;
    const char *ver = strstr(ptx, "\n.version ");
    int maj = 0, min = 0;
    if (!ver || sscanf(ver, "\n.version %d.%d", &maj, &min) != 2 || !strstr(ptx, "\n.target sm_") ||
        !strstr(ptx, ".address_size 64"))
        return FAIL(CUDA_ERROR_INVALID_IMAGE, "not PTX text the mock knows (.version, .target, "
                                              ".address_size 64)");
    if (maj * 10 + min > ptx_isa_max())
        return FAIL(CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
                    "PTX ISA %d.%d; driver %d takes up to %d.%d", maj, min, KVP_CUDA_MOCK_DRIVER,
                    ptx_isa_max() / 10, ptx_isa_max() % 10);
    int sm = 0;
    if (sscanf(strstr(ptx, "\n.target sm_"), "\n.target sm_%d", &sm) != 1 || sm > 90)
        return FAIL(CUDA_ERROR_INVALID_PTX, "target sm_%d: the mock device is sm_90", sm);
    pthread_mutex_lock(&g_mu);
    CUmodule m = g_nmods < MAX_MODULES ? &g_mods[g_nmods++] : NULL;
    if (m) {
        *m = (struct CUmod_st){MAGIC_MOD, t_cur, 0};
        /* the kernel of gpu_kernel.cu: its entry and its parameters (u64, u32) */
        const char *e = strstr(ptx, ".entry kvp_gpu_gather(");
        m->has_gather = e && strstr(e, ".param .u64 kvp_gpu_gather_param_0") &&
                        strstr(e, ".param .u32 kvp_gpu_gather_param_1");
    }
    pthread_mutex_unlock(&g_mu);
    if (!m)
        return FAIL(CUDA_ERROR_OUT_OF_MEMORY, "too many modules");
    COUNT(modules, 1);
    *module = m;
    return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    HANDLE_CTX();
    if (!hfunc || !name)
        return FAIL(CUDA_ERROR_INVALID_VALUE, "hfunc %p name %p", (void *)hfunc, (void *)name);
    if (!slot_of(hmod, g_mods, MAX_MODULES, sizeof *hmod) || hmod->magic != MAGIC_MOD)
        return FAIL(CUDA_ERROR_INVALID_HANDLE, "module %p", (void *)hmod);
    if (strcmp(name, "kvp_gpu_gather") != 0 || !hmod->has_gather)
        return FAIL(CUDA_ERROR_NOT_FOUND, "no function %s in the module", name);
    CUfunction f = &g_fns[hmod - g_mods];
    *f = (struct CUfunc_st){MAGIC_FN, hmod};
    *hfunc = f;
    return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                    unsigned int gridDimZ, unsigned int blockDimX,
                                    unsigned int blockDimY, unsigned int blockDimZ,
                                    unsigned int sharedMemBytes, CUstream hStream,
                                    void **kernelParams, void **extra)
{
    NEED_CTX();
    if (!slot_of(f, g_fns, MAX_MODULES, sizeof *f) || f->magic != MAGIC_FN)
        return FAIL(CUDA_ERROR_INVALID_HANDLE, "function %p", (void *)f);
    if (f->mod->ctx != t_cur)
        return FAIL(CUDA_ERROR_INVALID_HANDLE, "function %p was loaded in context %p, not the "
                                               "current %p", (void *)f, (void *)f->mod->ctx,
                    (void *)t_cur);
    CUresult r = stream_of_ctx(hStream, __func__);
    if (r != CUDA_SUCCESS)
        return r;
    unsigned long long threads = (unsigned long long)blockDimX * blockDimY * blockDimZ;
    if (!gridDimX || !gridDimY || !gridDimZ || gridDimX > 0x7fffffffu || gridDimY > 65535 ||
        gridDimZ > 65535 || !threads || threads > 1024 || blockDimZ > 64 || sharedMemBytes > 49152)
        return FAIL(CUDA_ERROR_INVALID_VALUE, "grid %u x %u x %u, block %u x %u x %u, shared %u",
                    gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes);
    if (extra)
        return FAIL(CUDA_ERROR_NOT_SUPPORTED, "extra parameters are not modelled");
    if (!kernelParams || !kernelParams[0] || !kernelParams[1])
        return FAIL(CUDA_ERROR_INVALID_VALUE, "kvp_gpu_gather takes 2 parameters");
    if (g_launch_fail) {
        COUNT(launch_refused, 1);
        return FAIL(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "KVP_CUDA_MOCK_LAUNCH_FAIL=1");
    }
    mitem *it = item_new(IT_KERNEL, 0, __func__);
    if (!it)
        return FAIL(CUDA_ERROR_OUT_OF_MEMORY, "no memory");
    /* parameters are copied at launch, as the driver does */
    memcpy(&it->table, kernelParams[0], sizeof it->table);
    memcpy(&it->ntiles, kernelParams[1], sizeof it->ntiles);
    COUNT(launches, 1);
    COUNT(tiles, it->ntiles);
    push(hStream, it);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------- report */

__attribute__((destructor)) static void report(void)
{
    const char *path = getenv("KVP_CUDA_MOCK_STATS");
    if (!path || !*path || !__atomic_load_n(&g_inited, __ATOMIC_ACQUIRE))
        return;
    kvp_cuda_mock_counters s;
    kvp_cuda_mock_stats(&s);
    char b[1024];
    int n = snprintf(b, sizeof b,
                     "pid=%d allocs=%llu frees=%llu registers=%llu unregisters=%llu "
                     "host_allocs=%llu host_frees=%llu streams=%llu events=%llu "
                     "async_copies=%llu batch_calls=%llu batch_copies=%llu batch_refused=%llu "
                     "modules=%llu launches=%llu tiles=%llu launch_refused=%llu sync_copies=%llu "
                     "pageable=%llu bytes=%llu errors=%llu no_context=%llu faults=%llu\n",
                     (int)getpid(), (unsigned long long)s.allocs, (unsigned long long)s.frees,
                     (unsigned long long)s.registers, (unsigned long long)s.unregisters,
                     (unsigned long long)s.host_allocs, (unsigned long long)s.host_frees,
                     (unsigned long long)s.streams, (unsigned long long)s.events,
                     (unsigned long long)s.async_copies, (unsigned long long)s.batch_calls,
                     (unsigned long long)s.batch_copies, (unsigned long long)s.batch_refused,
                     (unsigned long long)s.modules, (unsigned long long)s.launches,
                     (unsigned long long)s.tiles, (unsigned long long)s.launch_refused,
                     (unsigned long long)s.sync_copies, (unsigned long long)s.pageable,
                     (unsigned long long)s.bytes, (unsigned long long)s.errors,
                     (unsigned long long)s.no_context, (unsigned long long)s.faults);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
        ssize_t w = write(fd, b, (size_t)n);
        (void)w;
        close(fd);
    }
}
