/*
 * nucx.c -- the node's UCX registration and progress thread; see nucx.h.
 *
 * Everything UCP needs from the node is made in kvp_nucx_start, before the
 * thread exists: context, worker (single-threaded: afterwards only the
 * thread touches it), registration, packed rkey, worker address, and the
 * encoded UCX_ATTACH answer. The thread then only progresses the worker,
 * backing off to 1 ms naps while nothing comes (kvp_ucx_idle: an event fd
 * would cost the shared-memory transports).
 */
#include "node/nucx.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/buf.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/ucx.h"
#include "kvpool.h"
#include "proto/proto.h"

#define MOD "nucx"

struct kvp_nucx {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_mem_h memh;
    int stop;     /* atomic: the thread returns */
    pthread_t th;
    int th_started;
    kvp_buf attach; /* the UCX_ATTACH answer body */
};

static void *progress_main(void *arg)
{
    kvp_nucx *u = arg;
    unsigned idle = 0;
    while (!__atomic_load_n(&u->stop, __ATOMIC_ACQUIRE)) {
        if (kvp_ucx.worker_progress(u->worker))
            idle = 0;
        else
            kvp_ucx_idle(&idle);
    }
    return NULL;
}

void kvp_nucx_stop(kvp_nucx *u)
{
    if (!u)
        return;
    if (u->th_started) {
        __atomic_store_n(&u->stop, 1, __ATOMIC_RELEASE);
        pthread_join(u->th, NULL); /* within a nap: 1 ms */
    }
    if (u->memh)
        kvp_ucx.mem_unmap(u->ctx, u->memh); /* revokes the rkey on RDMA hardware */
    if (u->worker)
        kvp_ucx.worker_destroy(u->worker);
    if (u->ctx)
        kvp_ucx.cleanup(u->ctx);
    kvp_buf_free(&u->attach);
    kvp_free(u);
}

/* Registers the segment and encodes the UCX_ATTACH answer. */
static int register_segment(kvp_nucx *u, uint8_t *base, uint64_t size, char *err, size_t errlen)
{
    ucp_mem_map_params_t mp = {0};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = base;
    mp.length = size;
    ucs_status_t st = kvp_ucx.mem_map(u->ctx, &mp, &u->memh);
    if (st != UCS_OK) {
        u->memh = NULL;
        snprintf(err, errlen, "ucp_mem_map of the %llu-byte segment: %s",
                 (unsigned long long)size, kvp_ucx.status_string(st));
        return KVP_ENOT_SUPPORTED;
    }
    void *rkey = NULL;
    size_t rlen = 0;
    ucp_address_t *addr = NULL;
    size_t alen = 0;
    if ((st = kvp_ucx.rkey_pack(u->ctx, u->memh, &rkey, &rlen)) != UCS_OK) {
        snprintf(err, errlen, "ucp_rkey_pack: %s", kvp_ucx.status_string(st));
        return KVP_ENOT_SUPPORTED;
    }
    if ((st = kvp_ucx.worker_get_address(u->worker, &addr, &alen)) != UCS_OK) {
        kvp_ucx.rkey_buffer_release(rkey);
        snprintf(err, errlen, "ucp_worker_get_address: %s", kvp_ucx.status_string(st));
        return KVP_ENOT_SUPPORTED;
    }
    int rc = 0;
    if (rlen == 0 || rlen > KVP_UCX_BLOB_MAX || alen == 0 || alen > KVP_UCX_BLOB_MAX) {
        snprintf(err, errlen, "UCX worker address (%zu B) or rkey (%zu B) beyond %d bytes", alen,
                 rlen, KVP_UCX_BLOB_MAX);
        rc = KVP_ENOT_SUPPORTED;
    } else {
        kvp_msg_ucx_attach m = {(uint64_t)(uintptr_t)base, size,
                                {(const uint8_t *)addr, (uint32_t)alen},
                                {(const uint8_t *)rkey, (uint32_t)rlen}};
        kvp_buf_init(&u->attach, 2 * KVP_UCX_BLOB_MAX + 64);
        kvp_enc_ucx_attach(&u->attach, &m);
        if (u->attach.err)
            rc = KVP_ENOMEM;
    }
    kvp_ucx.worker_release_address(u->worker, addr);
    kvp_ucx.rkey_buffer_release(rkey);
    return rc;
}

int kvp_nucx_start(uint8_t *base, uint64_t size, const char *net_devices, kvp_nucx **out,
                   char *err, size_t errlen)
{
    kvp_nucx *u = kvp_calloc(1, sizeof *u);
    if (!u)
        return KVP_ENOMEM;
    int rc = kvp_ucx_context(0, net_devices, &u->ctx, err, errlen);
    if (!rc)
        rc = kvp_ucx_worker(u->ctx, UCS_THREAD_MODE_SINGLE, &u->worker, err, errlen);
    if (!rc)
        rc = register_segment(u, base, size, err, errlen);
    if (!rc && pthread_create(&u->th, NULL, progress_main, u) != 0) {
        snprintf(err, errlen, "cannot start the UCX progress thread");
        rc = KVP_ENOMEM;
    }
    if (rc) {
        kvp_nucx_stop(u);
        return rc;
    }
    u->th_started = 1;
    *out = u;
    return 0;
}

const uint8_t *kvp_nucx_attach_body(const kvp_nucx *u, uint32_t *len)
{
    *len = (uint32_t)u->attach.len;
    return u->attach.data;
}
