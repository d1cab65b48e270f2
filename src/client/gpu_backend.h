/*
 * gpu_backend.h -- the operation table behind gpu.h (gpu.c only, and the
 * two backends: gpu_cuda.c, gpu_fake.c).
 *
 * gpu.c owns what is common: choosing the backend, tickets over the
 * backend's per-stream markers, the stream and staging-ring pools. A
 * backend implements memory and copies:
 *   classify       as kvp_gpu_classify
 *   host_register  page-lock (and map for the device) host memory
 *   stream_new     a stream of dev: opaque, with room for KVP_GPU_TICKETS
 *                  markers; stream_free drains and destroys it
 *   bind           makes dev current on this thread
 *   copy           enqueues pieces in one direction
 *   mark(t)        records marker t (slot t % KVP_GPU_TICKETS) after what
 *                  is enqueued; done(t): 0 passed, 1 not yet, < 0 failed
 *   drain          waits for everything on the stream (no deadline); < 0 when
 *                  something on it failed
 *   dev_alloc ...  test and benchmark memory; memcpy is synchronous
 * Every function returns 0 or KVP_EDEVICE unless stated; `why` fills
 * kvp_gpu_status()'s reason.
 */
#ifndef KVP_GPU_BACKEND_H
#define KVP_GPU_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "client/gpu.h"

typedef struct kvp_gpu_backend {
    const char *name;
    int (*classify)(const void *p, size_t len, kvp_gpu_dev **dev);
    int (*host_register)(void *p, size_t len);
    void (*host_unregister)(void *p);
    void *(*stream_new)(kvp_gpu_dev *dev);
    void (*stream_free)(void *s);
    int (*bind)(kvp_gpu_dev *dev);
    int (*copy)(void *s, int dir, const kvp_gpu_piece *p, size_t n);
    int (*mark)(void *s, uint64_t t);
    int (*done)(void *s, uint64_t t);
    int (*drain)(void *s);
    void *(*dev_alloc)(int ordinal, size_t len);
    void (*dev_free)(void *p);
    int (*memcpy_sync)(void *dst, const void *src, size_t len);
    void *(*host_alloc)(size_t len);
    void (*host_free)(void *p);
    const char *(*copy_mode)(void);
} kvp_gpu_backend;

/* The CUDA backend: NULL (with the reason in why) when the driver cannot
 * be used; `force` loads libcuda.so.1 even when this process has not. */
const kvp_gpu_backend *kvp_gpu_cuda_open(int force, char *why, size_t whylen);
/* The fake backend (always available). */
const kvp_gpu_backend *kvp_gpu_fake_open(void);
#endif
