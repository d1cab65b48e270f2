/*
 * cucx.c -- one-sided UCX transfers; see cucx.h.
 *
 * A job (kvp_cucx_run) owns the worker under `mu` from its first request
 * to its last completion. Each op has an opctx counting its requests in
 * flight; completions (callbacks, run inside worker_progress on this
 * thread) decrement it and keep the first error. The wait loop progresses
 * the worker; when nothing moved it yields, then naps (kvp_ucx_idle). At the deadline the
 * endpoint is closed by force, which completes every request still in
 * flight with an error, so no request outlives the job (and the caller's
 * buffers are free again on return).
 */
#include "client/cucx.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "common/csum.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/ucx.h"
#include "kvpool.h"
#include "proto/proto.h"

#define MOD "ucx"
#define CHUNK (256u << 10) /* a put hashes this much, then hands it to UCX */

struct kvp_cucx {
    pthread_mutex_t mu; /* the worker is driven by one thread at a time */
    ucp_context_h ctx;
    ucp_worker_h worker;
    void **orphans;     /* opctx arrays with requests still queued after a forced
                           close (UCX's shared-memory endpoints purge them only
                           when the worker goes): freed after the worker (under mu) */
    size_t norphans;
};

struct kvp_cucx_peer {
    ucp_ep_h ep;       /* NULL once closed by a deadline */
    ucp_rkey_h rkey;
    uint64_t base, size;
    int failed;        /* atomic: set by the error handler or a deadline */
    int no_peer_errors; /* the endpoint has no peer error handling (UCX's
                           shared-memory transports): closed gently */
};

typedef struct opctx {
    unsigned pending;  /* requests in flight */
    ucs_status_t st;   /* the first failure */
    int finished;      /* get: hashed and decided */
} opctx;

int kvp_cucx_create(kvp_cucx **out, char *err, size_t errlen)
{
    kvp_cucx *u = kvp_calloc(1, sizeof *u);
    if (!u)
        return KVP_ENOMEM;
    int rc = kvp_ucx_context(1, NULL, &u->ctx, err, errlen);
    if (!rc && (rc = kvp_ucx_worker(u->ctx, UCS_THREAD_MODE_SERIALIZED, &u->worker, err,
                                    errlen)) != 0) {
        kvp_ucx.cleanup(u->ctx);
    }
    if (rc) {
        kvp_free(u);
        return rc;
    }
    pthread_mutex_init(&u->mu, NULL);
    *out = u;
    return 0;
}

void kvp_cucx_destroy(kvp_cucx *u)
{
    if (!u)
        return;
    kvp_ucx.worker_destroy(u->worker); /* completes the orphans' last requests */
    kvp_ucx.cleanup(u->ctx);
    for (size_t i = 0; i < u->norphans; i++)
        kvp_free(u->orphans[i]);
    kvp_free(u->orphans);
    pthread_mutex_destroy(&u->mu);
    kvp_free(u);
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    (void)ep;
    kvp_cucx_peer *p = arg;
    __atomic_store_n(&p->failed, 1, __ATOMIC_RELEASE);
    KVP_WARN_LIMITED(MOD, "endpoint failed: %s", kvp_ucx.status_string(st));
}

static void ep_close_locked(kvp_cucx *u, kvp_cucx_peer *p);

int kvp_cucx_connect(kvp_cucx *u, const uint8_t *attach, uint32_t len, kvp_cucx_peer **pp)
{
    kvp_msg_ucx_attach m;
    if (kvp_dec_ucx_attach(attach, len, &m) != 0)
        return KVP_EPROTOCOL;
    kvp_cucx_peer *p = *pp ? *pp : kvp_calloc(1, sizeof *p);
    void *addr = p ? kvp_malloc(m.addr.len) : NULL; /* aligned for UCX */
    if (!addr) {
        if (!*pp)
            kvp_free(p);
        return KVP_ENOMEM;
    }
    memcpy(addr, m.addr.p, m.addr.len);
    ucp_ep_params_t ep = {0};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = addr;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = on_ep_error;
    ep.err_handler.arg = p;
    pthread_mutex_lock(&u->mu);
    ep_close_locked(u, p); /* the old endpoint, if any */
    p->base = m.base;
    p->size = m.size;
    ucs_status_t st = kvp_ucx.ep_create(u->worker, &ep, &p->ep);
    if (st == UCS_ERR_UNREACHABLE) {
        /* UCX's shared-memory transports cannot report a dead peer: such an
         * endpoint fails by our deadline instead of by UCX's error */
        ep.field_mask &= ~(uint64_t)UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        st = kvp_ucx.ep_create(u->worker, &ep, &p->ep);
        p->no_peer_errors = st == UCS_OK;
    }
    const char *what = "endpoint to the node";
    if (st != UCS_OK) {
        p->ep = NULL;
    } else if ((st = kvp_ucx.ep_rkey_unpack(p->ep, m.rkey.p, &p->rkey)) != UCS_OK) {
        p->rkey = NULL;
        what = "the node's rkey";
        ep_close_locked(u, p);
    } else {
        __atomic_store_n(&p->failed, 0, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&u->mu);
    kvp_free(addr);
    if (st != UCS_OK) {
        KVP_WARN_LIMITED(MOD, "%s: %s", what, kvp_ucx.status_string(st));
        if (!*pp)
            kvp_free(p);
        return KVP_ETRANSFER_FAIL;
    }
    *pp = p;
    return 0;
}

/* Closes p's endpoint by force and progresses until the close completed
 * (every request still in flight completes first, with an error). Caller
 * holds mu. */
static void ep_close_locked(kvp_cucx *u, kvp_cucx_peer *p)
{
    if (p->rkey)
        kvp_ucx.rkey_destroy(p->rkey);
    p->rkey = NULL;
    if (!p->ep)
        return;
    ucp_request_param_t prm = {0};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_EP_CLOSE_FLAG_FORCE; /* a graceful close waits for the peer */
    ucs_status_ptr_t r = kvp_ucx.ep_close_nbx(p->ep, &prm);
    if (r && !UCS_PTR_IS_ERR(r)) {
        while (kvp_ucx.request_check_status(r) == UCS_INPROGRESS)
            kvp_ucx.worker_progress(u->worker);
        kvp_ucx.request_free(r);
    }
    p->ep = NULL;
    __atomic_store_n(&p->failed, 1, __ATOMIC_RELEASE);
}

void kvp_cucx_close(kvp_cucx *u, kvp_cucx_peer *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&u->mu);
    ep_close_locked(u, p);
    pthread_mutex_unlock(&u->mu);
    kvp_free(p);
}

int kvp_cucx_failed(const kvp_cucx_peer *p)
{
    return __atomic_load_n(&p->failed, __ATOMIC_ACQUIRE);
}

/* ------------------------------------------------------------- requests */

static void on_done(void *req, ucs_status_t st, void *arg)
{
    opctx *o = arg;
    if (st != UCS_OK && o->st == UCS_OK)
        o->st = st;
    o->pending--;
    kvp_ucx.request_free(req);
}

/* One put or get of [buf, buf + len) at the segment's offset off. */
static void issue(kvp_cucx_peer *p, int is_write, opctx *o, void *buf, size_t len, uint64_t off)
{
    ucp_request_param_t prm = {0};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    prm.cb.send = on_done;
    prm.user_data = o;
    ucs_status_ptr_t r = is_write ? kvp_ucx.put_nbx(p->ep, buf, len, p->base + off, p->rkey, &prm)
                                  : kvp_ucx.get_nbx(p->ep, buf, len, p->base + off, p->rkey, &prm);
    if (UCS_PTR_IS_ERR(r)) {
        if (o->st == UCS_OK)
            o->st = UCS_PTR_STATUS(r);
    } else if (r) {
        o->pending++;
    }
}

/* Issues op's requests; a put hashes each chunk just before it goes. */
static void issue_op(kvp_cucx_peer *p, int is_write, kvp_xfer_op *op, opctx *o)
{
    kvp_csum hs;
    if (is_write && op->want_csum)
        kvp_csum_reset(&hs);
    uint64_t off = op->rep.offset;
    for (int i = 0; i < op->iovcnt && o->st == UCS_OK; i++) {
        uint8_t *b = op->iov[i].iov_base;
        size_t len = op->iov[i].iov_len;
        for (size_t at = 0; at < len && o->st == UCS_OK;) {
            size_t c = is_write && len - at > CHUNK ? CHUNK : len - at;
            if (is_write && op->want_csum)
                kvp_csum_update(&hs, b + at, c);
            issue(p, is_write, o, b + at, c, off);
            at += c;
            off += c;
        }
    }
    if (is_write && op->want_csum)
        op->csum = kvp_csum_digest(&hs);
}

/* A get whose requests all completed: its checksum, its status. */
static void finish_get(kvp_xfer_op *op, opctx *o)
{
    if (o->st == UCS_OK && op->want_csum) {
        kvp_csum hs;
        kvp_csum_reset(&hs);
        for (int i = 0; i < op->iovcnt; i++)
            kvp_csum_update(&hs, op->iov[i].iov_base, op->iov[i].iov_len);
        op->csum = kvp_csum_digest(&hs);
    }
    op->status = o->st == UCS_OK ? 0 : KVP_ETRANSFER_FAIL;
    o->finished = 1;
}

/* Progresses until every op's requests (and the flush) completed, or the
 * deadline. 0, or KVP_ERPC_TIMEOUT. Gets are finished as they complete. */
static int wait_all(kvp_cucx *u, int is_write, kvp_xfer_op *const *ops, opctx *oc, size_t n,
                    const opctx *flush, uint64_t deadline_ms)
{
    size_t from = 0; /* ops [0, from) are complete */
    unsigned idle = 0;
    for (;;) {
        while (from < n && !oc[from].pending && !flush->pending) {
            if (!is_write && ops[from]->status == 1 && !oc[from].finished)
                finish_get(ops[from], &oc[from]);
            from++;
        }
        for (size_t k = from; !is_write && k < n; k++) /* gets done out of order */
            if (!oc[k].pending && !oc[k].finished && ops[k]->status == 1)
                finish_get(ops[k], &oc[k]);
        if (from == n)
            return 0;
        if (kvp_ucx.worker_progress(u->worker)) {
            idle = 0;
            continue;
        }
        if (kvp_now_ms() >= deadline_ms)
            return KVP_ERPC_TIMEOUT;
        kvp_ucx_idle(&idle);
    }
}

/* Frees a job's opctx array, or keeps it until the worker goes when UCX
 * still holds requests that name it. Caller holds mu. */
static void oc_release(kvp_cucx *u, opctx *oc, size_t n)
{
    size_t left = 0;
    for (size_t k = 0; k <= n; k++)
        left += oc[k].pending;
    if (!left) {
        kvp_free(oc);
        return;
    }
    void **no = kvp_realloc(u->orphans, (u->norphans + 1) * sizeof *no);
    if (no) {
        u->orphans = no;
        u->orphans[u->norphans++] = oc;
    } /* else: leaked, which is safe where freeing is not */
    KVP_WARN_LIMITED(MOD, "%zu requests of a cut batch are still queued in UCX", left);
}

void kvp_cucx_run(kvp_cucx *u, kvp_cucx_peer *p, int is_write, kvp_xfer_op *const *ops,
                  size_t n, uint64_t deadline_ms)
{
    /* oc[n] is the flush: UCX may complete it (and anything) after a forced
     * close, so it lives with the others, never on this stack */
    opctx *oc = kvp_calloc(n + 1, sizeof *oc);
    if (!oc) {
        for (size_t k = 0; k < n; k++)
            ops[k]->status = KVP_ENOMEM;
        return;
    }
    opctx *flush = &oc[n];
    pthread_mutex_lock(&u->mu);
    int dead = !p->ep || kvp_cucx_failed(p);
    for (size_t k = 0; k < n; k++) {
        kvp_xfer_op *op = ops[k];
        const kvp_replica *r = &op->rep;
        if (r->offset > p->size || r->length > p->size - r->offset) {
            op->status = is_write ? KVP_EINVALID_WRITE : KVP_EINVALID_READ;
            oc[k].finished = 1;
        } else if (dead) {
            op->status = KVP_ETRANSFER_FAIL;
            oc[k].finished = 1;
        } else {
            issue_op(p, is_write, op, &oc[k]);
            kvp_ucx.worker_progress(u->worker); /* keep the first requests moving */
        }
    }
    if (is_write && !dead) { /* remote completion of every put before PUT_END */
        ucp_request_param_t prm = {0};
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        prm.cb.send = on_done;
        prm.user_data = flush;
        ucs_status_ptr_t r = kvp_ucx.ep_flush_nbx(p->ep, &prm);
        if (UCS_PTR_IS_ERR(r))
            flush->st = UCS_PTR_STATUS(r);
        else if (r)
            flush->pending = 1;
    }
    int rc = dead ? 0 : wait_all(u, is_write, ops, oc, n, flush, deadline_ms);
    if (rc) {
        KVP_WARN_LIMITED(MOD, "a batch outlived its deadline: endpoint closed");
        ep_close_locked(u, p); /* completes what it can of what is in flight */
    }
    for (size_t k = 0; k < n; k++) {
        kvp_xfer_op *op = ops[k];
        if (op->status != 1)
            continue;
        if (rc)
            op->status = KVP_ERPC_TIMEOUT;
        else if (is_write)
            op->status = oc[k].st == UCS_OK && flush->st == UCS_OK ? 0 : KVP_ETRANSFER_FAIL;
        else if (!oc[k].finished)
            finish_get(op, &oc[k]);
    }
    oc_release(u, oc, n);
    pthread_mutex_unlock(&u->mu);
}
