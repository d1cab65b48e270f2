/*
 * gpu.h -- device (CUDA) memory for the data plane: which memory a pointer
 * is, page-locking host ranges, streams, batched copies, staging rings.
 *
 * Backends (one process-wide operation table, chosen once, no #ifdef in the
 * request path):
 *   cuda  the CUDA driver API through dlopen("libcuda.so.1"). Nothing links
 *         against CUDA: the library builds, installs and runs without it.
 *         The driver is used only once this process has loaded it (an engine
 *         that holds device memory has: torch, vLLM), so a host-only user
 *         never initialises CUDA. Copies of many pieces go out as one
 *         cuMemcpyBatchAsync (driver >= 12.8) or one launch of the gather /
 *         scatter kernel (gpu_kernel.cu, built by nvcc when present and
 *         embedded), else one cuMemcpyAsync per piece; KVPOOL_GPU_COPY =
 *         auto | batch | kernel | each chooses (auto: batch, else kernel,
 *         else each).
 *   fake  the test backend (KVPOOL_GPU_BACKEND=fake, or kvp_gpu_use_fake):
 *         "device memory" is a memfd mapped twice, once PROT_NONE at the
 *         address handed out (a CPU access there faults, as it would on a
 *         GPU) and once read-write where only the backend copies; copies run
 *         in order on one thread per stream, later than they were enqueued,
 *         so a missing wait shows; async copies to or from host memory that
 *         was not page-locked are counted; any operation can be made to fail
 *         (kvp_gpu_fake_fail). It exercises every path of the data plane on
 *         machines without a GPU.
 *   off   KVPOOL_GPU_BACKEND=off: every pointer is host memory.
 *
 * Contracts:
 *  - kvp_gpu_classify decides what a range is; callers do it once per
 *    registered region (kvp_client_register_buffer), not per piece.
 *  - Copies are asynchronous on a stream; a ticket (kvp_gpu_mark) says when
 *    everything enqueued before it is done (kvp_gpu_wait). A stream or a
 *    staging ring is given back only idle (kvp_gpu_stream_put drains it), so
 *    a copy never lands in memory someone else owns.
 *  - All functions are thread-safe; a stream is used by one thread at a time.
 */
#ifndef KVP_GPU_H
#define KVP_GPU_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvp_gpu_dev kvp_gpu_dev;       /* a device (its context); process-lived */
typedef struct kvp_gpu_stream kvp_gpu_stream; /* a stream of one device, pooled */
typedef struct kvp_gpu_stage kvp_gpu_stage;   /* a ring of page-locked buffers, pooled */

enum { KVP_GPU_D2H = 0, KVP_GPU_H2D = 1 };

/* One piece of a copy: len bytes from src to dst. */
typedef struct kvp_gpu_piece {
    void *dst;
    const void *src;
    size_t len;
} kvp_gpu_piece;

/* "cuda", "fake" or "off" and, when the driver cannot be used, why
 * ("libcuda.so.1 not loaded in this process", "cuInit: ..."). Never NULL. */
const char *kvp_gpu_status(void);
/* 1 when device pointers can exist in this process (a backend is usable). */
int kvp_gpu_active(void);

/*
 * What [p, p+len) is: 0 host memory (*dev = NULL), 1 device memory of *dev
 * (the whole range inside one allocation), or < 0: KVP_EINVALID_PARAMS
 * (device memory crossing its allocation's end), KVP_EDEVICE (the driver is
 * loaded but failed: the reason in kvp_gpu_status()).
 */
int kvp_gpu_classify(const void *p, size_t len, kvp_gpu_dev **dev);

/* 1 when [p, p+len) lies in mappings of this process that are readable
 * and writable (/proc/self/maps), else 0. Device memory is not (the driver
 * reserves it PROT_NONE in this address space). */
int kvp_gpu_host_mapped(const void *p, size_t len);

/* Page-locks host memory for DMA (cuMemHostRegister, portable + mapped).
 * 0, or KVP_EDEVICE (copies from it then still work, slower). */
int kvp_gpu_host_register(void *p, size_t len);
void kvp_gpu_host_unregister(void *p);

/* A stream of dev from the pool (created on first need), or NULL
 * (KVP_EDEVICE). put waits for its work to finish, then pools it. */
kvp_gpu_stream *kvp_gpu_stream_get(kvp_gpu_dev *dev);
void kvp_gpu_stream_put(kvp_gpu_stream *s);
/* Makes the stream's device current on the calling thread (each job does
 * it first; threads are per batch). 0 or KVP_EDEVICE. */
int kvp_gpu_stream_bind(kvp_gpu_stream *s);

/* Enqueues n copies in one direction (device pieces on the device side,
 * host pieces page-locked for full speed). 0 or KVP_EDEVICE. */
int kvp_gpu_copy(kvp_gpu_stream *s, int dir, const kvp_gpu_piece *p, size_t n);
/* A ticket for everything enqueued on s so far (>= 1), or 0 (KVP_EDEVICE:
 * then kvp_gpu_wait(s, 0) drains the stream). At most KVP_GPU_TICKETS
 * tickets are outstanding per stream: waiting on the oldest frees one. */
#define KVP_GPU_TICKETS 64
uint64_t kvp_gpu_mark(kvp_gpu_stream *s);
/* Waits for ticket t (0 = the whole stream), until deadline_ms (kvp_now_ms
 * clock; 0 = no deadline). 0, KVP_ERPC_TIMEOUT, or KVP_EDEVICE when a copy
 * before it failed. */
int kvp_gpu_wait(kvp_gpu_stream *s, uint64_t t, uint64_t deadline_ms);

/* A staging ring of dev: `slots` page-locked buffers of slot_bytes each
 * (KVPOOL_GPU_STAGE_SLOTS x KVPOOL_GPU_STAGE_BYTES, default 4 x 4 MiB), at
 * most KVPOOL_GPU_STAGE_RINGS (default 8) in the process: get waits for one
 * to come back until deadline_ms, then NULL (KVP_ERPC_TIMEOUT). */
kvp_gpu_stage *kvp_gpu_stage_get(kvp_gpu_dev *dev, uint64_t deadline_ms);
void kvp_gpu_stage_put(kvp_gpu_stage *st);
size_t kvp_gpu_stage_slots(const kvp_gpu_stage *st);
size_t kvp_gpu_stage_slot_bytes(const kvp_gpu_stage *st);
uint8_t *kvp_gpu_stage_slot(kvp_gpu_stage *st, size_t i);

/* ------------------------------------- for tests, benchmarks, checks */

/* Device memory of device `ordinal` (cuMemAlloc / the fake's), or NULL. */
void *kvp_gpu_dev_alloc(int ordinal, size_t len);
void kvp_gpu_dev_free(void *p);
/* Synchronous copy between any two memories (cuMemcpy). 0 or KVP_EDEVICE. */
int kvp_gpu_memcpy(void *dst, const void *src, size_t len);
/* Page-locked host memory (cuMemHostAlloc), or NULL. */
void *kvp_gpu_host_alloc(size_t len);
void kvp_gpu_host_free(void *p);
/* The copy strategy in use: "batch", "kernel", "each" (or "fake"). */
const char *kvp_gpu_copy_mode(void);

/* Switches the process to the fake backend (before any device use). */
void kvp_gpu_use_fake(void);
/* Fake backend: the n-th (1-based) later call of op fails ("copy",
 * "register", "stream", "stage", "wait", "classify"); n = 0 clears. */
void kvp_gpu_fake_fail(const char *op, int n);
/* Fake backend counters. */
typedef struct kvp_gpu_fake_stats {
    uint64_t copies;          /* pieces copied */
    uint64_t copy_calls;      /* kvp_gpu_copy calls */
    uint64_t pageable;        /* pieces whose host side was not page-locked */
    uint64_t registered;      /* host ranges registered now */
    uint64_t streams;         /* streams created */
} kvp_gpu_fake_stats;
void kvp_gpu_fake_get_stats(kvp_gpu_fake_stats *out);
#endif
