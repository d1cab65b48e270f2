/*
 * client.c -- the store client (include/kvpool.h, kvp_client_*): asks the
 * master where values live (one batched request per step) and moves the
 * bytes itself through the data plane (client/xfer.h).
 *
 * Put of a batch (DESIGN §2):
 *   PUT_START(all keys)          one request; OBJECT_ALREADY_EXISTS = success
 *                                with 0 bytes moved (keys are immutable)
 *   SEGMENT_INFO(unknown ids)    one request, only for segments xfer lacks
 *   xfer writes                  one op per replica of every key, in parallel
 *   PUT_END(keys fully written)  one request, with each value's XXH3-64
 *   PUT_REVOKE(the others)       one request; their result is the write error
 * Get of a batch:
 *   GET(all keys)                one request: size, checksum, lease, replicas
 *   xfer reads, in rounds        round r reads replica r of every key still
 *                                unserved; replicas ordered shm-reachable first;
 *                                a transfer error or checksum mismatch moves
 *                                that key on to its next replica
 *   RELEASE(leases)              one ONEWAY request: queued, flushed, no answer
 * A read verified after its lease ended (request start + lease_ttl) is
 * LEASE_EXPIRED, never data: the space may have been reused meanwhile.
 *
 * Batches larger than a quarter of the master's max frame (request or
 * answer) are split into several requests, each step above per chunk.
 *
 * Master connection: one kvp_rpc under c->mu (client_int.h). See mcall for
 * the failure and reconnect rules.
 */
#include "client/client_int.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack: no malloc */
#include <xxhash.h>

#include "client/gpu.h"
#include "common/assert.h"
#include "common/buf.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/secret.h"
#include "ha/etcd.h"
#include "node/segment.h"
#include "proto/proto.h"

#define MOD "client"

/* Largest answer we accept from the master, and the cap on the frame size
 * batches are sized against (a master configured larger gains nothing). */
#define RESP_CAP (64u << 20)
/* Most keys in one master request, whatever the frame allows: keeps the
 * per-chunk arrays and the master's per-request work moderate. */
#define CHUNK_MAX 65536u
/* Answer bytes per key, upper bounds from the encoders (master.c fits()). */
#define RESP_PER_GET (40u + 5 * 8 * KVP_MAX_REPLICAS)
#define RESP_PER_PUT_START (8u + 5 * 8 * KVP_MAX_REPLICAS)
#define RESP_PER_CODE 4u
#define RESP_PER_XL KVP_XL_ENT_SIZE
#define RESP_PER_SEG_INFO (300u + 64 * 1024 / 64)
/* Heartbeat period floor, whatever client_ttl says. */
#define HB_MIN_MS 50u

/* ------------------------------------------------------------- helpers */

/* The tenant every request names (config "tenant", validated non-empty). */
static kvp_bytes tenant_of(const kvp_client *c)
{
    return (kvp_bytes){(const uint8_t *)c->cfg.tenant, (uint32_t)strlen(c->cfg.tenant)};
}

static int timeout_ms(const kvp_client *c)
{
    return c->cfg.rpc_timeout_ms > INT_MAX ? INT_MAX : (int)c->cfg.rpc_timeout_ms;
}

static void seterr(char *err, size_t errlen, const char *fmt, const char *a, const char *b)
{
    if (err && errlen)
        snprintf(err, errlen, fmt, a, b);
}

static int64_t pieces_total(const kvp_iov *v, size_t n)
{
    if (n && !v)
        return KVP_EINVALID_PARAMS;
    if (n > (size_t)INT_MAX)
        return KVP_EINVALID_PARAMS;
    uint64_t t = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i].len && !v[i].base)
            return KVP_EINVALID_PARAMS;
        if (v[i].len > (uint64_t)INT64_MAX - t)
            return KVP_EINVALID_PARAMS;
        t += v[i].len;
    }
    return (int64_t)t;
}

/* Copies the first `size` bytes' worth of pieces into out (which has room
 * for n entries), trimming the last; returns the iovec count. The caller
 * checked that the pieces hold at least `size` bytes. */
static int fit_iov(const kvp_iov *v, size_t n, uint64_t size, struct iovec *out)
{
    int k = 0;
    for (size_t i = 0; i < n && size > 0; i++) {
        if (!v[i].len)
            continue;
        size_t l = v[i].len < size ? v[i].len : (size_t)size;
        out[k].iov_base = v[i].base;
        out[k].iov_len = l;
        k++;
        size -= l;
    }
    return k;
}

/* A key as wire bytes, or KVP_EINVALID_KEY (NULL, empty, or longer than
 * max_key_size: the master would refuse the whole request). */
/*
 * Memory kinds of a key's pieces v[0..n) into dev[0..n) (1 = device
 * memory) and the device they are on (*gdev, NULL when all are host
 * memory). Registered ranges answer from the table (their kind was found
 * at registration); other pieces are asked of the driver, and only when
 * this process can hold device memory at all (`active`: kvp_gpu_active(),
 * asked once per request chunk, not per key: it costs a dlopen probe). 0, or KVP_EINVALID_PARAMS
 * (pieces on two devices, a device piece crossing its allocation) /
 * KVP_EDEVICE (the driver failed).
 */
static size_t reg_upper(const kvp_client *c, uintptr_t p);

static int piece_kinds(kvp_client *c, int active, const kvp_iov *v, size_t n, uint8_t *dev,
                       struct kvp_gpu_dev **gdev)
{
    *gdev = NULL;
    memset(dev, 0, n);
    if (!active && __atomic_load_n(&c->ndevregs, __ATOMIC_ACQUIRE) == 0)
        return 0; /* the common case: no device memory anywhere */
    int rc = 0;
    pthread_mutex_lock(&c->reg_mu);
    for (size_t i = 0; i < n && rc == 0; i++) {
        uintptr_t b = (uintptr_t)v[i].base;
        struct kvp_gpu_dev *d = NULL;
        if (v[i].len == 0)
            continue;
        size_t j = reg_upper(c, b);
        if (j > 0 && b - c->regs[j - 1].base < c->regs[j - 1].len &&
            v[i].len <= c->regs[j - 1].len - (b - c->regs[j - 1].base))
            d = c->regs[j - 1].dev;
        else if (active && (rc = kvp_gpu_classify(v[i].base, v[i].len, &d)) > 0)
            rc = 0;
        if (rc == 0 && d) {
            if (*gdev && *gdev != d)
                rc = KVP_EINVALID_PARAMS; /* one value, two devices */
            *gdev = d;
            dev[i] = 1;
        }
    }
    pthread_mutex_unlock(&c->reg_mu);
    return rc;
}

static int key_bytes(const kvp_client *c, const char *key, kvp_bytes *out)
{
    if (!key)
        return KVP_EINVALID_KEY;
    size_t l = strnlen(key, (size_t)c->cfg.max_key + 1);
    if (l == 0 || l > c->cfg.max_key)
        return KVP_EINVALID_KEY;
    out->p = (const uint8_t *)key;
    out->len = (uint32_t)l;
    return 0;
}

/* ------------------------------------------------------ master connection */

/* Opens a connection (new HELLO, new random client id) into c->rpc.
 * Caller holds c->mu (or is kvp_client_open, before any thread exists). */
static int connect_locked(kvp_client *c, char *err, size_t errlen)
{
    char ebuf[256];
    if (!err || !errlen) {
        err = ebuf;
        errlen = sizeof ebuf;
    }
    kvp_rpc_opts o = {0};
    o.token = c->cfg.cluster_token[0] ? c->cfg.cluster_token : NULL;
    o.name = c->name;
    o.client_id = 0;
    o.max_frame = RESP_CAP;
    o.timeout_ms = timeout_ms(c);
    o.tenant_token = c->cfg.tenant_token;
    kvp_rpc *r;
    int rc = kvp_rpc_open(c->cfg.master_addr, &o, &r, err, errlen);
    if (rc) {
        KVP_DEBUG(MOD, "connect to master %s: %s", c->cfg.master_addr, err);
        return rc;
    }
    const kvp_msg_hello_resp *h = kvp_rpc_hello_resp(r);
    if (c->master_id && h->master_id != c->master_id)
        KVP_INFO(MOD, "master %s restarted (id %016llx -> %016llx)", c->cfg.master_addr,
                 (unsigned long long)c->master_id, (unsigned long long)h->master_id);
    /* a new client id: the same master keeps the old id's last report in
     * its sums, so this id reports from there; another master (a restart,
     * a new leader) has none of ours, so this id reports our whole life */
    if (h->master_id == c->master_id) {
        c->hb_base = c->hb_acked;
    } else {
        memset(&c->hb_base, 0, sizeof c->hb_base);
        memset(&c->hb_acked, 0, sizeof c->hb_acked);
        c->hb_plain = 0;
    }
    c->master_id = h->master_id;
    uint32_t mf = h->max_frame < RESP_CAP ? h->max_frame : RESP_CAP;
    __atomic_store_n(&c->max_frame, mf, __ATOMIC_RELAXED);
    __atomic_store_n(&c->lease_ttl_ms, h->lease_ttl_ms, __ATOMIC_RELAXED);
    __atomic_store_n(&c->client_ttl_ms, h->client_ttl_ms, __ATOMIC_RELAXED);
    c->rpc = r;
    return 0;
}

static void drop_locked(kvp_client *c)
{
    kvp_rpc_close(c->rpc);
    c->rpc = NULL;
}

/* One request/answer on the current connection; the answer body is copied
 * into resp (may be NULL). 0, the master's whole-request status, or the
 * rpc's error. Caller holds c->mu and c->rpc != NULL. */
static int call_locked(kvp_client *c, uint16_t op, const kvp_buf *req, kvp_buf *resp)
{
    int32_t st = 0;
    const uint8_t *b = NULL;
    uint32_t bl = 0;
    int rc = kvp_rpc_call(c->rpc, op, req->data, req->len, &st, &b, &bl);
    if (rc)
        return rc;
    if (st)
        return st;
    if (resp) {
        kvp_buf_reset(resp);
        kvp_buf_put(resp, b, bl);
        return resp->err;
    }
    return 0;
}

/* How a request may be repeated on a new connection after the old one broke. */
enum retry {
    RETRY_SAFE,          /* idempotent or harmless twice (reads, PUT_END, RELEASE...) */
    RETRY_IF_NEW_MASTER, /* PUT_START: only when the master restarted, since the
                            first attempt may have created pending objects that a
                            repeat would see as OBJECT_ALREADY_EXISTS (= success) */
};

/*
 * One master request: `req` is the body of `op`; the answer body is copied
 * into resp. Returns 0, the master's status for the whole request (< 0),
 * or a transport error. Every attempt is bounded by rpc_timeout.
 *
 * Failures of the connection:
 *  - KVP_ERPC_FAIL (broken connection, e.g. the master restarted): the
 *    connection is replaced once (new HELLO, new client id, so the master
 *    revokes whatever the old identity left pending when it sees the old
 *    connection close) and the request repeated per `retry`; a second
 *    failure is KVP_ERPC_FAIL.
 *  - KVP_ERPC_TIMEOUT (master alive but silent): the connection is closed
 *    (same revocation) and the timeout reported without a repeat, so a call
 *    never waits two full deadlines on one request.
 * While disconnected, the next call connects first (one attempt).
 */
static int mcall(kvp_client *c, uint16_t op, const kvp_buf *req, enum retry retry, kvp_buf *resp)
{
    if (req->err)
        return req->err;
    pthread_mutex_lock(&c->mu);
    int rc;
    if (!c->rpc) {
        rc = connect_locked(c, NULL, 0);
        if (rc == 0) {
            rc = call_locked(c, op, req, resp);
            if (rc == KVP_ERPC_FAIL || rc == KVP_ERPC_TIMEOUT)
                drop_locked(c);
        }
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    uint64_t mid = c->master_id;
    rc = call_locked(c, op, req, resp);
    if (rc == KVP_ERPC_FAIL) {
        drop_locked(c);
        if (connect_locked(c, NULL, 0) != 0) {
            rc = KVP_ERPC_FAIL;
        } else if (retry == RETRY_SAFE || c->master_id != mid) {
            rc = call_locked(c, op, req, resp);
            if (rc == KVP_ERPC_FAIL || rc == KVP_ERPC_TIMEOUT)
                drop_locked(c);
        }
    } else if (rc == KVP_ERPC_TIMEOUT) {
        drop_locked(c);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Queues and flushes a ONEWAY request (RELEASE); no answer is read. Best
 * effort: when it cannot be sent, the leases simply expire. */
static void msend_oneway(kvp_client *c, uint16_t op, const kvp_buf *req)
{
    if (req->err)
        return;
    pthread_mutex_lock(&c->mu);
    if (c->rpc) {
        kvp_rpc_queue(c->rpc, op, KVP_FLAG_ONEWAY, req->data, req->len);
        int rc = kvp_rpc_flush(c->rpc);
        if (rc == KVP_ERPC_FAIL || rc == KVP_ERPC_TIMEOUT)
            drop_locked(c);
    }
    pthread_mutex_unlock(&c->mu);
}

/* A transfer's status meaning its segment could not be reached: moved
 * nothing usable (TRANSFER_FAIL), no connection (RPC_FAIL: refused, reset),
 * no answer (RPC_TIMEOUT). */
static int unreachable(int status)
{
    return status == KVP_ETRANSFER_FAIL || status == KVP_ERPC_FAIL || status == KVP_ERPC_TIMEOUT;
}

/* Tells the master which segments transfers could not reach (unreachable()):
 * it stops placing there until their nodes heartbeat, so the next puts go to
 * live segments. Best effort, one ONEWAY frame. */
static void report_failing(kvp_client *c, const kvp_xfer_op *ops, size_t n)
{
    enum { MAXIDS = 64 };
    uint64_t ids[MAXIDS];
    uint32_t ni = 0;
    for (size_t i = 0; i < n && ni < MAXIDS; i++) {
        if (!unreachable(ops[i].status))
            continue;
        uint32_t k;
        for (k = 0; k < ni && ids[k] != ops[i].rep.segment_id; k++)
            ;
        if (k == ni)
            ids[ni++] = ops[i].rep.segment_id;
    }
    if (!ni)
        return;
    uint8_t body[4 + 8 * MAXIDS];
    kvp_buf b = {body, 0, sizeof body, sizeof body, 0};
    kvp_msg_ids m = {ni, ids};
    kvp_enc_ids(&b, &m);
    msend_oneway(c, KVP_OP_SEG_FAILING, &b);
}

/* Byte budget of one request or answer. */
static size_t frame_budget(kvp_client *c)
{
    uint32_t mf = __atomic_load_n(&c->max_frame, __ATOMIC_RELAXED);
    if (mf < 4096)
        mf = 4096;
    return mf / 4;
}

/*
 * How many of keys[0..n) go into one request: request bytes (4 + key +
 * extra_req per key) and answer bytes (resp_per per key) both within the
 * frame budget, at most CHUNK_MAX. At least 1 when n >= 1: one key (<= 64
 * KiB) always fits a budget of >= 1 KiB... and a budget is >= 1 KiB only
 * for masters configured below 4 KiB frames, which config forbids.
 */
/*
 * Puts the valid keys of keys[0..n) in k[0..m) with their caller indexes
 * in idx[]; an invalid key gets its code in r64[i] or r32[i] (whichever is
 * given). Returns m.
 */
static size_t valid_keys(const kvp_client *c, const char *const *keys, size_t n, kvp_bytes *k,
                         size_t *idx, int64_t *r64, int *r32)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int rc = key_bytes(c, keys[i], &k[m]);
        if (rc == 0)
            idx[m++] = i;
        else if (r64)
            r64[i] = rc;
        else
            r32[i] = rc;
    }
    return m;
}

static size_t chunk_len(kvp_client *c, const kvp_bytes *keys, size_t n, size_t extra_req,
                        size_t resp_per)
{
    size_t budget = frame_budget(c) - 256; /* room for tenant, counts, header */
    size_t req = 0, i = 0;
    while (i < n && i < CHUNK_MAX) {
        size_t add = 4 + (size_t)keys[i].len + extra_req;
        if (i > 0 && (req + add > budget || (i + 1) * resp_per > budget))
            break;
        req += add;
        i++;
    }
    return i;
}

/* Per-call scratch: a request body, a copy of the answer, decode arena. */
typedef struct scratch {
    kvp_buf req;
    kvp_buf resp;
    kvp_arena a;
} scratch;

static void scratch_init(scratch *s)
{
    kvp_buf_init(&s->req, RESP_CAP);
    kvp_buf_init(&s->resp, RESP_CAP);
    kvp_arena_init(&s->a, 256u << 20);
}

static void scratch_reset(scratch *s)
{
    kvp_buf_reset(&s->req);
    kvp_arena_reset(&s->a);
}

static void scratch_free(scratch *s)
{
    kvp_buf_free(&s->req);
    kvp_buf_free(&s->resp);
    kvp_arena_free(&s->a);
}

/* ----------------------------------------------------- segment discovery */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/*
 * Makes every segment in ids[0..n) known to xfer: one SEGMENT_INFO (per
 * frame budget) for the ids xfer does not know, then kvp_xfer_add_segment.
 * Ids the master no longer knows stay unknown; transfers to them fail with
 * SEGMENT_NOT_FOUND. Sorts ids in place. 0 or the request's error.
 */
static int discover(kvp_client *c, uint64_t *ids, size_t n)
{
    qsort(ids, n, sizeof *ids, cmp_u64);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if ((m == 0 || ids[m - 1] != ids[i]) && !kvp_xfer_has_segment(c->xfer, ids[i]))
            ids[m++] = ids[i];
    if (m == 0)
        return 0;
    scratch s;
    scratch_init(&s);
    size_t per = frame_budget(c) / RESP_PER_SEG_INFO;
    if (per == 0)
        per = 1;
    int rc = 0;
    for (size_t off = 0; off < m && rc == 0; off += per) {
        scratch_reset(&s);
        size_t k = m - off < per ? m - off : per;
        kvp_msg_ids q = {(uint32_t)k, ids + off};
        kvp_enc_ids(&s.req, &q);
        rc = mcall(c, KVP_OP_SEGMENT_INFO, &s.req, RETRY_SAFE, &s.resp);
        if (rc)
            break;
        kvp_msg_seg_info_resp r;
        rc = kvp_dec_seg_info_resp(s.resp.data, (uint32_t)s.resp.len, &c->lim, &s.a, &r);
        if (rc == 0 && r.n != k)
            rc = KVP_EPROTOCOL;
        for (uint32_t i = 0; rc == 0 && i < r.n; i++) {
            if (r.infos[i].status != 0)
                continue;
            int arc = kvp_xfer_add_segment(c->xfer, &r.infos[i].desc);
            if (arc)
                KVP_WARN(MOD, "segment %016llx: cannot add to the data plane: %s",
                         (unsigned long long)r.infos[i].desc.id, kvp_strerror(arc));
        }
    }
    scratch_free(&s);
    return rc;
}

/* --------------------------------------------------------------- open */

static void *hb_main(void *arg);
static void heartbeat_last(kvp_client *c);

static void client_free(kvp_client *c)
{
    if (c->hb_started) {
        pthread_mutex_lock(&c->hb_mu);
        c->hb_stop = 1;
        pthread_cond_signal(&c->hb_cv);
        pthread_mutex_unlock(&c->hb_mu);
        pthread_join(c->hb_thread, NULL);
        heartbeat_last(c);
    }
    if (c->node)
        kvp_node_stop(c->node);
    if (c->xfer)
        kvp_xfer_destroy(c->xfer);
    if (c->rpc)
        kvp_rpc_close(c->rpc);
    kvp_free(c->regs);
    pthread_cond_destroy(&c->hb_cv);
    pthread_mutex_destroy(&c->hb_mu);
    pthread_mutex_destroy(&c->reg_mu);
    pthread_mutex_destroy(&c->mu);
    kvp_free(c);
}

/*
 * Environment: KVPOOL_FORCE_TCP=1 makes the data plane use TCP even for
 * segments on this host (kvp_xfer_opts.force_tcp); KVPOOL_FORCE_UCX=1 uses
 * UCX for them wherever the node offers it (force_ucx). For tests and
 * benchmarks of the remote paths. Not config keys: they are debugging
 * aids, not deployment choices.
 */
static int env_flag(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

/* s without leading and trailing white space into out ("" if none). */
static void copy_trimmed(char *out, size_t cap, const char *s)
{
    static const char ws[] = " \t\r\n";
    s += strspn(s, ws);
    size_t n = strlen(s);
    while (n && strchr(ws, s[n - 1]))
        n--;
    if (n >= cap)
        n = cap - 1;
    memcpy(out, s, n);
    out[n] = 0;
}

/*
 * The segment puts prefer (spec §3.3): the config's preferred_segment (an
 * explicit override, validated non-blank), else $MOONCAKE_PREFERRED_SEGMENT
 * (blank = unset), else the client's own embedded segment. The master
 * places the first copy there when it has room, elsewhere otherwise.
 */
static void choose_preferred(kvp_client *c)
{
    const char *env = getenv("MOONCAKE_PREFERRED_SEGMENT");
    if (c->cfg.preferred_segment[0])
        copy_trimmed(c->pref_name, sizeof c->pref_name, c->cfg.preferred_segment);
    else if (env)
        copy_trimmed(c->pref_name, sizeof c->pref_name, env);
    if (!c->pref_name[0])
        snprintf(c->pref_name, sizeof c->pref_name, "%s", c->seg_name);
}

/* kvp_client_open from a configuration text (cfg NULL) or a parsed one. */
static int client_open(const char *config, const kvp_config *cfg, kvp_client **out, char *err,
                       size_t errlen);

int kvp_client_open(const char *config, kvp_client **out, char *err, size_t errlen)
{
    return client_open(config, NULL, out, err, errlen);
}

int kvp_client_open_config(const kvp_config *cfg, kvp_client **out, char *err, size_t errlen)
{
    if (!cfg) {
        if (err && errlen)
            snprintf(err, errlen, "kvp_client_open_config: cfg is NULL");
        return KVP_EINVALID_PARAMS;
    }
    return client_open(NULL, cfg, out, err, errlen);
}

static int client_open(const char *config, const kvp_config *cfg, kvp_client **out, char *err,
                       size_t errlen)
{
    char ebuf[KVP_CONFIG_ERRLEN];
    if (!err || !errlen) {
        err = ebuf;
        errlen = sizeof ebuf;
    }
    err[0] = 0;
    if (!out) {
        snprintf(err, errlen, "kvp_client_open: out is NULL");
        return KVP_EINVALID_PARAMS;
    }
    *out = NULL;
    kvp_client *c = kvp_calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return KVP_ENOMEM;
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->reg_mu, NULL);
    pthread_mutex_init(&c->hb_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->hb_cv, &ca);
    pthread_condattr_destroy(&ca);

    int rc = 0;
    if (cfg)
        c->cfg = *cfg;
    else {
        kvp_config_defaults(&c->cfg);
        rc = kvp_config_load_spec(&c->cfg, config, err, errlen);
    }
    if (rc == 0)
        rc = kvp_config_validate(&c->cfg, err, errlen);
    /* before anything logs: "log_level" given here sets the process level
     * (unless $KVPOOL_LOG_LEVEL is set); see common/log.h */
    if (rc == 0)
        kvp_config_apply_log_level(&c->cfg);
    if (rc == 0)
        rc = kvp_secret_resolve(&c->cfg, err, errlen);
    /* etcd credentials are the process's (ha/etcd.h): set only when given */
    if (rc == 0 && (c->cfg.etcd_user[0] || c->cfg.etcd_cacert[0]))
        rc = kvp_etcd_auth_configure(c->cfg.etcd_user, c->cfg.etcd_password_file,
                                     c->cfg.etcd_cacert, c->cfg.etcd_cert, c->cfg.etcd_key, err,
                                     errlen);
    if (rc) {
        client_free(c);
        return rc;
    }
    /* an embedded segment the machine cannot back is refused before anything starts */
    int embedded = strcmp(kvp_config_mode(&c->cfg), "embedded") == 0 &&
                   c->cfg.global_segment_size > 0;
    if (embedded && (rc = kvp_segment_check_size(c->cfg.global_segment_size, err, errlen))) {
        char m[KVP_CONFIG_ERRLEN];
        snprintf(m, sizeof m, "%s", err);
        seterr(err, errlen, "embedded mode: %s%s", m, "");
        client_free(c);
        return rc;
    }
    kvp_proto_limits_default(&c->lim);
    snprintf(c->name, sizeof c->name, "client %s %ld", c->cfg.local_hostname, (long)getpid());

    rc = connect_locked(c, err, errlen);
    if (rc) {
        client_free(c);
        return rc;
    }
    kvp_xfer_opts xo = {0};
    xo.cluster_token = c->cfg.cluster_token[0] ? c->cfg.cluster_token : NULL;
    xo.client_id = kvp_rpc_client_id(c->rpc);
    xo.force_tcp = env_flag("KVPOOL_FORCE_TCP");
    xo.use_ucx = strcmp(c->cfg.protocol, "tcp") != 0; /* ucx, or rdma: its Mooncake name */
    xo.force_ucx = env_flag("KVPOOL_FORCE_UCX");
    xo.timeout_ms = timeout_ms(c);
    rc = kvp_xfer_create(&xo, &c->xfer);
    if (rc) {
        seterr(err, errlen, "data plane: %s%s", kvp_strerror(rc), "");
        client_free(c);
        return rc;
    }
    if (embedded) {
        kvp_node_opts no = {0};
        no.cfg = &c->cfg;
        no.master_optional = 0;
        rc = kvp_node_start(&no, &c->node, err, errlen);
        if (rc) {
            client_free(c);
            return rc;
        }
        snprintf(c->seg_name, sizeof c->seg_name, "%s", kvp_node_name(c->node));
    }
    choose_preferred(c);
    if (pthread_create(&c->hb_thread, NULL, hb_main, c) != 0) {
        seterr(err, errlen, "cannot start the heartbeat thread: %s%s", strerror(errno), "");
        client_free(c);
        return KVP_EINTERNAL_ERROR;
    }
    c->hb_started = 1;
    *out = c;
    return 0;
}

void kvp_client_close(kvp_client *c)
{
    if (c)
        client_free(c);
}

/*
 * The data-path report a HEARTBEAT carries (proto.h): the counters now
 * (into *now) less hb_base, into b; nothing when the master takes plain
 * heartbeats only. Caller holds c->mu.
 *
 * Exactness: the master sums each client id's last report. A report the
 * master applied but whose answer was lost (a timeout, then a new id) is
 * not in hb_acked, so the next id reports it again: at most one
 * heartbeat's worth counted twice. What moved after an id's last report
 * and before the id changed to another master is not counted there.
 */
static void hb_report_locked(kvp_client *c, kvp_buf *b, kvp_xfer_counters *now)
{
    if (c->hb_plain)
        return;
    kvp_xfer_counts(c->xfer, now);
    kvp_msg_heartbeat h = {.version = KVP_HB_REPORT_V1, .npaths = KVP_XFER_NPATHS};
    for (int p = 0; p < KVP_XFER_NPATHS; p++) {
        const kvp_xfer_tally *v = &now->path[p], *o = &c->hb_base.path[p];
        h.paths[p] = (kvp_path_tally){v->put_bytes - o->put_bytes, v->get_bytes - o->get_bytes,
                                      v->put_ops - o->put_ops, v->get_ops - o->get_ops};
    }
    kvp_enc_heartbeat(b, &h);
}

/*
 * One HEARTBEAT with this client's report. Like mcall (RETRY_SAFE), except
 * that the body is made on the connection it goes out on: a report counts
 * from its client id's base, which a reconnect changes. A master that
 * refuses the report (PROTOCOL: an older release) gets the heartbeat again
 * without it, and plain heartbeats from then on.
 */
static int heartbeat(kvp_client *c)
{
    uint8_t raw[2 + KVP_XFER_NPATHS * KVP_HB_PATH_SIZE];
    int rc, fresh = 0;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        if (!c->rpc) {
            if ((rc = connect_locked(c, NULL, 0)) != 0)
                break;
            fresh = 1;
        }
        kvp_buf b = {raw, 0, sizeof raw, sizeof raw, 0};
        kvp_xfer_counters now;
        hb_report_locked(c, &b, &now);
        rc = b.err ? b.err : call_locked(c, KVP_OP_HEARTBEAT, &b, NULL);
        if (rc == KVP_EPROTOCOL && b.len) {
            KVP_INFO(MOD, "master %s takes no data-path reports (an older release): the "
                          "pool's per-path figures will not count this client",
                     c->cfg.master_addr);
            c->hb_plain = 1;
            b.len = 0;
            rc = call_locked(c, KVP_OP_HEARTBEAT, &b, NULL);
        }
        if (rc == 0 && b.len)
            c->hb_acked = now;
        if (rc == KVP_ERPC_FAIL || rc == KVP_ERPC_TIMEOUT)
            drop_locked(c);
        if (rc != KVP_ERPC_FAIL || fresh)
            break;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* At close: the last report, ONEWAY (no answer awaited, so a silent master
 * cannot hold the close), when anything moved since the last one the
 * master accepted. Best effort. */
static void heartbeat_last(kvp_client *c)
{
    uint8_t raw[2 + KVP_XFER_NPATHS * KVP_HB_PATH_SIZE];
    kvp_buf b = {raw, 0, sizeof raw, sizeof raw, 0};
    kvp_xfer_counters now;
    pthread_mutex_lock(&c->mu);
    if (c->rpc && c->xfer) {
        hb_report_locked(c, &b, &now);
        if (b.len && !b.err && memcmp(&now, &c->hb_acked, sizeof now) != 0) {
            kvp_rpc_queue(c->rpc, KVP_OP_HEARTBEAT, KVP_FLAG_ONEWAY, b.data, b.len);
            if (kvp_rpc_flush(c->rpc) == 0)
                c->hb_acked = now;
        }
    }
    pthread_mutex_unlock(&c->mu);
}

/*
 * Heartbeat thread: HEARTBEAT every client_ttl/3 (the master's value from
 * HELLO) on the master connection, so a client that only reads stays
 * alive; each carries the data-path report (heartbeat()).
 */
static void *hb_main(void *arg)
{
    kvp_client *c = arg;
    pthread_mutex_lock(&c->hb_mu);
    while (!c->hb_stop) {
        uint32_t ttl = __atomic_load_n(&c->client_ttl_ms, __ATOMIC_RELAXED);
        uint32_t period = ttl / 3 > HB_MIN_MS ? ttl / 3 : HB_MIN_MS;
        struct timespec ts = kvp_deadline_ms(period);
        while (!c->hb_stop && pthread_cond_timedwait(&c->hb_cv, &c->hb_mu, &ts) != ETIMEDOUT)
            ;
        if (c->hb_stop)
            break;
        pthread_mutex_unlock(&c->hb_mu);
        int rc = heartbeat(c);
        if (rc)
            KVP_DEBUG(MOD, "heartbeat: %s", kvp_strerror(rc));
        pthread_mutex_lock(&c->hb_mu);
    }
    pthread_mutex_unlock(&c->hb_mu);
    return NULL;
}

/* ----------------------------------------------------------------- put */

/*
 * One chunk of a put: k[0..m) are valid keys with their caller indexes
 * idx[], pieces and sizes. Fills results[idx[i]], and sets again[i] for a
 * key that may be put once more: a replica's segment was unreachable, the
 * master was told (SEG_FAILING) and the put revoked (confirmed), so a new
 * PUT_START places it elsewhere and cannot meet its own leftover.
 */
/* What PUT_START asks for besides the keys: resolved from kvp_put_opts. */
typedef struct put_args {
    uint32_t replicas;
    uint32_t flags;     /* KVP_PUT_* of the protocol */
    uint64_t soft_ttl_ms; /* with KVP_PUT_SOFT_TTL */
    kvp_bytes preferred;
    const kvp_block *blocks; /* per key of the call, or NULL */
} put_args;
_Static_assert(sizeof(kvp_block) == sizeof(kvp_blkinfo) &&
                   offsetof(kvp_block, flags) == offsetof(kvp_blkinfo, flags) &&
                   KVP_BLOCK_PARENT == KVP_BLK_F_PARENT && KVP_BLOCK_NONE == KVP_BLK_F_NONE,
               "kvp_block is the protocol's kvp_blkinfo");

static void put_chunk(kvp_client *c, scratch *s, const put_args *pa, const kvp_bytes *k,
                      const size_t *idx, const uint64_t *sizes, const kvp_blkinfo *bk, size_t m,
                      const kvp_iov *const *iovs, const size_t *niov, int64_t *results,
                      uint8_t *again)
{
    memset(again, 0, m);
    scratch_reset(s);
    kvp_msg_put_start ps = {tenant_of(c), pa->replicas,
                            pa->flags | (bk ? KVP_PUT_F_BLOCKS : 0), pa->soft_ttl_ms,
                            pa->preferred, (uint32_t)m, (kvp_bytes *)k, (uint64_t *)sizes,
                            (kvp_blkinfo *)bk};
    kvp_enc_put_start(&s->req, &ps);
    int rc = mcall(c, KVP_OP_PUT_START, &s->req, RETRY_IF_NEW_MASTER, &s->resp);
    kvp_msg_put_start_resp pr = {0};
    if (rc == 0)
        rc = kvp_dec_put_start_resp(s->resp.data, (uint32_t)s->resp.len, &c->lim, &s->a, &pr);
    if (rc == 0 && pr.n != m)
        rc = KVP_EPROTOCOL;
    if (rc) {
        for (size_t i = 0; i < m; i++)
            results[idx[i]] = rc;
        return;
    }

    /* Work arrays: iovecs per key, ops per replica, checksums, segment ids. */
    size_t niovs = 0, nops = 0;
    for (size_t i = 0; i < m; i++) {
        kvp_put_result *r = &pr.results[i];
        if (r->status == KVP_EOBJECT_ALREADY_EXISTS) {
            results[idx[i]] = 0; /* dedup: first writer wins, nothing moved */
        } else if (r->status != 0) {
            results[idx[i]] = r->status;
        } else if (r->n_replicas == 0 || r->n_replicas > KVP_MAX_REPLICAS) {
            results[idx[i]] = KVP_EINVALID_REPLICA; /* left for PUT_REVOKE below */
        } else {
            niovs += niov[idx[i]];
            nops += r->n_replicas;
        }
    }
    struct iovec *iov = kvp_calloc(niovs + 1, sizeof *iov);
    uint8_t *devs = kvp_calloc(niovs + 1, 1); /* per piece: device memory */
    int *kerr = kvp_calloc(m, sizeof *kerr);  /* per key: its pieces' kinds are unusable */
    int *iovcnt = kvp_calloc(m, sizeof *iovcnt);
    size_t *iovoff = kvp_calloc(m, sizeof *iovoff);
    kvp_xfer_op *ops = kvp_calloc(nops + 1, sizeof *ops);
    uint64_t *segids = kvp_calloc(nops + 1, sizeof *segids);
    uint64_t *csums = kvp_calloc(m, sizeof *csums);
    kvp_bytes *endk = kvp_calloc(m, sizeof *endk);
    kvp_bytes *revk = kvp_calloc(m, sizeof *revk);
    size_t *endi = kvp_calloc(m, sizeof *endi);
    size_t *revi = kvp_calloc(m, sizeof *revi);
    if (!iov || !devs || !kerr || !iovcnt || !iovoff || !ops || !segids || !csums || !endk || !revk ||
        !endi || !revi) {
        rc = KVP_ENOMEM;
        for (size_t i = 0; i < m; i++)
            results[idx[i]] = rc;
        nops = 0;
    }
    size_t nend = 0, nrev = 0;
    int gpu = rc == 0 && kvp_gpu_active();
    if (rc == 0) {
        /* Every allocated key gets its pieces and checksum; every replica an op. */
        size_t vo = 0, oo = 0;
        for (size_t i = 0; i < m; i++) {
            kvp_put_result *r = &pr.results[i];
            if (r->status != 0)
                continue;
            if (r->n_replicas == 0 || r->n_replicas > KVP_MAX_REPLICAS) {
                revk[nrev] = k[i];
                revi[nrev++] = i;
                continue;
            }
            const kvp_iov *v = iovs[idx[i]];
            iovoff[i] = vo;
            for (size_t j = 0; j < niov[idx[i]]; j++) {
                iov[vo + j].iov_base = v[j].base;
                iov[vo + j].iov_len = v[j].len;
            }
            iovcnt[i] = (int)niov[idx[i]];
            struct kvp_gpu_dev *gd = NULL;
            int krc = kerr[i] = piece_kinds(c, gpu, v, niov[idx[i]], devs + vo, &gd);
            vo += niov[idx[i]];
            for (uint32_t j = 0; j < r->n_replicas; j++) {
                ops[oo].rep = r->replicas[j];
                ops[oo].iov = iov + iovoff[i];
                ops[oo].iovcnt = krc ? -1 : iovcnt[i]; /* -1: not run (kerr says why) */
                ops[oo].want_csum = j == 0; /* hashed while the first copy moves */
                ops[oo].dev = gd ? devs + iovoff[i] : NULL;
                ops[oo].gdev = gd;
                ops[oo].status = 0;
                segids[oo] = r->replicas[j].segment_id;
                oo++;
            }
        }
        KVP_ASSERT(oo == nops && vo == niovs); /* both passes saw the same keys */
        int drc = discover(c, segids, nops);
        if (drc)
            KVP_DEBUG(MOD, "SEGMENT_INFO: %s", kvp_strerror(drc));
        int xrc = nops ? kvp_xfer_run(c->xfer, 1, ops, nops, kvp_now_ms() + c->cfg.rpc_timeout_ms) : 0;
        if (xrc)
            for (size_t o = 0; o < nops; o++)
                ops[o].status = xrc;
        else
            report_failing(c, ops, nops);
        /* Classify: a key is published only when every replica was written. */
        oo = 0;
        for (size_t i = 0; i < m; i++) {
            kvp_put_result *r = &pr.results[i];
            if (r->status != 0 || r->n_replicas == 0 || r->n_replicas > KVP_MAX_REPLICAS)
                continue;
            int bad = kerr[i];
            csums[i] = ops[oo].csum; /* from the first replica's transfer */
            for (uint32_t j = 0; j < r->n_replicas; j++, oo++)
                if (ops[oo].status && !bad)
                    bad = ops[oo].status;
            if (bad) {
                results[idx[i]] = bad;
                again[i] = !kerr[i] && unreachable(bad); /* confirmed by PUT_REVOKE below */
                revk[nrev] = k[i];
                revi[nrev++] = i;
            } else {
                endk[nend] = k[i];
                csums[nend] = csums[i]; /* nend <= i: compaction in place is safe */
                endi[nend++] = i;
            }
        }
        KVP_ASSERT(oo == nops && nend + nrev <= m);
    }
    if (nend) {
        scratch_reset(s);
        kvp_msg_put_end pe = {tenant_of(c), (uint32_t)nend, endk, csums};
        kvp_enc_put_end(&s->req, &pe);
        rc = mcall(c, KVP_OP_PUT_END, &s->req, RETRY_SAFE, &s->resp);
        kvp_msg_results er = {0};
        if (rc == 0)
            rc = kvp_dec_results(s->resp.data, (uint32_t)s->resp.len, &c->lim, &s->a, &er);
        if (rc == 0 && er.n != nend)
            rc = KVP_EPROTOCOL;
        for (size_t e = 0; e < nend; e++) {
            size_t i = endi[e];
            int code = rc ? rc : er.codes[e];
            results[idx[i]] = code ? code : (int64_t)sizes[i];
            if (rc && rc != KVP_ERPC_FAIL && rc != KVP_ERPC_TIMEOUT) {
                /* the master refused the request: the objects are still
                 * pending on a live connection; give their space back */
                revk[nrev] = k[i];
                revi[nrev++] = i;
            }
        }
    }
    KVP_ASSERT(nrev <= m); /* a key is revoked at most once: revk holds m */
    if (nrev) {
        scratch_reset(s);
        kvp_msg_keys rk = {tenant_of(c), (uint32_t)nrev, revk};
        kvp_enc_keys(&s->req, &rk);
        int vrc = mcall(c, KVP_OP_PUT_REVOKE, &s->req, RETRY_SAFE, &s->resp);
        kvp_msg_results vr = {0};
        if (vrc == 0)
            vrc = kvp_dec_results(s->resp.data, (uint32_t)s->resp.len, &c->lim, &s->a, &vr);
        if (vrc == 0 && vr.n != nrev)
            vrc = KVP_EPROTOCOL;
        if (vrc)
            KVP_DEBUG(MOD, "PUT_REVOKE of %zu keys: %s (put_timeout reclaims them)", nrev,
                      kvp_strerror(vrc));
        for (size_t v = 0; v < nrev; v++)
            if (vrc || vr.codes[v] != 0)
                again[revi[v]] = 0; /* still pending (or unknown): never put twice */
    }
    kvp_free(iov);
    kvp_free(devs);
    kvp_free(kerr);
    kvp_free(iovcnt);
    kvp_free(iovoff);
    kvp_free(ops);
    kvp_free(segids);
    kvp_free(csums);
    kvp_free(endk);
    kvp_free(revk);
    kvp_free(endi);
    kvp_free(revi);
}

void kvp_put_opts_init(kvp_put_opts *o)
{
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->soft_pin_ttl_ms = -1;
}

/* The first layout of kvp_put_opts: what a caller's struct_size must cover;
 * the fields after it (soft_pin_ttl_ms) take their defaults when a caller's
 * struct ends before them. */
#define PUT_OPTS_V1_SIZE (offsetof(kvp_put_opts, preferred_segment) + sizeof(const char *))
#define PUT_OPTS_HAS(o, f) ((o)->struct_size >= offsetof(kvp_put_opts, f) + sizeof((o)->f))
#define PUT_OPTS_FLAGS (KVP_PUT_HARD_PIN | KVP_PUT_REPLACE | KVP_PUT_SOFT_PIN | KVP_PUT_SOFT_UNPIN)
_Static_assert(KVP_PUT_HARD_PIN == KVP_PUT_PIN && KVP_PUT_REPLACE == KVP_PUT_F_REPLACE &&
                   KVP_PUT_SOFT_PIN == KVP_PUT_F_SOFT_PIN && KVP_PUT_SOFT_UNPIN == KVP_PUT_F_SOFT_UNPIN,
               "kvp_put_opts flags are the protocol's PUT_START flags");

/* Resolves opts (NULL = defaults) against the client's configuration. */
static int put_args_of(const kvp_client *c, const kvp_put_opts *o, put_args *pa)
{
    pa->replicas = (uint32_t)c->cfg.replica_num;
    pa->flags = 0;
    pa->soft_ttl_ms = 0;
    pa->blocks = NULL;
    const char *pref = c->pref_name;
    if (o) {
        if (o->struct_size < PUT_OPTS_V1_SIZE || o->struct_size > sizeof *o)
            return KVP_EINVALID_PARAMS;
        if (o->replica_num > KVP_MAX_REPLICAS || (o->flags & ~PUT_OPTS_FLAGS))
            return KVP_EINVALID_PARAMS;
        if (o->replica_num)
            pa->replicas = o->replica_num;
        /* the public flags are the protocol's (the master checks the soft
         * pin's combination and TTL, as Mooncake's master does) */
        pa->flags = o->flags;
        int64_t ttl = PUT_OPTS_HAS(o, soft_pin_ttl_ms) ? o->soft_pin_ttl_ms : -1;
        if (ttl < -1)
            return KVP_EINVALID_PARAMS;
        if (ttl >= 0) {
            pa->flags |= KVP_PUT_F_SOFT_TTL;
            pa->soft_ttl_ms = (uint64_t)ttl;
        }
        if (PUT_OPTS_HAS(o, blocks))
            pa->blocks = o->blocks;
        if (o->preferred_segment) {
            pref = o->preferred_segment;
            if (strlen(pref) >= sizeof c->pref_name)
                return KVP_EINVALID_PARAMS;
        }
    }
    pa->preferred = (kvp_bytes){(const uint8_t *)pref, (uint32_t)strlen(pref)};
    return 0;
}

int kvp_client_batch_put_from_multi_buffers(kvp_client *c, const char *const *keys,
                                            const kvp_iov *const *iovs, const size_t *niov,
                                            size_t n, int64_t *results)
{
    return kvp_client_batch_put_opts(c, keys, iovs, niov, n, NULL, results);
}

int kvp_client_batch_put_opts(kvp_client *c, const char *const *keys,
                              const kvp_iov *const *iovs, const size_t *niov, size_t n,
                              const kvp_put_opts *opts, int64_t *results)
{
    if (!c || (n && (!keys || !iovs || !niov || !results)))
        return KVP_EINVALID_PARAMS;
    put_args pa;
    int arc = put_args_of(c, opts, &pa);
    if (arc)
        return arc;
    if (n == 0)
        return 0;
    kvp_bytes *k = kvp_calloc(n, sizeof *k);
    size_t *idx = kvp_calloc(n, sizeof *idx);
    uint64_t *sizes = kvp_calloc(n, sizeof *sizes);
    kvp_blkinfo *bk = pa.blocks ? kvp_calloc(n, sizeof *bk) : NULL;
    uint8_t *again = kvp_calloc(n + 1, 1);
    if (!k || !idx || !sizes || !again || (pa.blocks && !bk)) {
        kvp_free(k);
        kvp_free(idx);
        kvp_free(sizes);
        kvp_free(bk);
        kvp_free(again);
        return KVP_ENOMEM;
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int rc = key_bytes(c, keys[i], &k[m]);
        int64_t t = rc ? rc : pieces_total(iovs[i], niov[i]);
        if (t == 0)
            t = KVP_EINVALID_PARAMS; /* empty values are not stored */
        if (t > 0 && bk && (pa.blocks[i].flags & ~(KVP_BLOCK_PARENT | KVP_BLOCK_NONE)))
            t = KVP_EINVALID_PARAMS;
        if (t < 0) {
            results[i] = t;
            continue;
        }
        idx[m] = i;
        sizes[m] = (uint64_t)t;
        if (bk)
            memcpy(&bk[m], &pa.blocks[i], sizeof bk[m]);
        m++;
    }
    scratch s;
    scratch_init(&s);
    /* a second round for the keys a chunk marked `again` (a segment that
     * could not be reached, now avoided by the master) */
    for (int round = 0; round < 2 && m > 0; round++) {
        size_t next = 0;
        for (size_t off = 0; off < m;) {
            size_t l = chunk_len(c, k + off, m - off, 8, RESP_PER_PUT_START);
            put_chunk(c, &s, &pa, k + off, idx + off, sizes + off, bk ? bk + off : NULL, l, iovs,
                      niov, results, again + off);
            off += l;
        }
        for (size_t i = 0; i < m; i++)
            if (again[i]) { /* compaction in place: next <= i */
                k[next] = k[i];
                idx[next] = idx[i];
                if (bk)
                    bk[next] = bk[i];
                sizes[next++] = sizes[i];
            }
        if (next)
            KVP_DEBUG(MOD, "put: %zu keys again, their segment could not be reached", next);
        m = next;
    }
    scratch_free(&s);
    kvp_free(again);
    kvp_free(k);
    kvp_free(idx);
    kvp_free(sizes);
    kvp_free(bk);
    return 0;
}

int kvp_client_put(kvp_client *c, const char *key, const void *buf, size_t len)
{
    kvp_iov v = {(void *)buf, len};
    const kvp_iov *vp = &v;
    size_t one = 1;
    int64_t r = 0;
    int rc = kvp_client_batch_put_from_multi_buffers(c, &key, &vp, &one, 1, &r);
    if (rc)
        return rc;
    return r < 0 ? (int)r : 0;
}

/* ----------------------------------------------------------------- get */

/* Per-key read state of one get chunk. */
typedef struct gstate {
    struct iovec *iov;
    int iovcnt;
    const uint8_t *dev;       /* per piece: device memory (NULL: all host) */
    struct kvp_gpu_dev *gdev;
    int kind_err;
    uint32_t next;   /* index of the next replica to try */
    int last_err;    /* error of the last failed attempt */
    int done;
} gstate;

/* Orders replicas shm-reachable first, keeping the master's order otherwise. */
static void order_replicas(kvp_client *c, kvp_get_result *r)
{
    kvp_replica tmp[KVP_MAX_REPLICAS];
    uint32_t n = 0;
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t j = 0; j < r->n_replicas; j++) {
            const char *t = kvp_xfer_transport(c->xfer, r->replicas[j].segment_id);
            int shm = t && strcmp(t, "shm") == 0;
            if (shm == (pass == 0))
                tmp[n++] = r->replicas[j];
        }
    memcpy(r->replicas, tmp, n * sizeof *tmp);
}

/*
 * One chunk of a get: k[0..m) valid keys at caller indexes idx[]. With
 * `trim` (single get into a larger buffer) pieces may hold more than the
 * value: only the value's size is read. Fills results[idx[i]].
 */
/* Destination memory chosen once sizes are known (kvp_client_batch_get_alloc):
 * fn fills pieces[caller index], one piece per key. */
typedef struct get_alloc {
    kvp_get_alloc_fn fn;
    void *arg;
    kvp_iov *pieces;
} get_alloc;

/* Asks ga for the memory of the keys the GET found (sizes[i] 0 for the
 * others). A refusal leaves their pieces empty: BUFFER_OVERFLOW below, and
 * the caller reports it as NOMEM. */
static void get_chunk_alloc(const get_alloc *ga, const kvp_msg_get_resp *gr, const size_t *idx,
                            size_t m)
{
    uint64_t *sz = kvp_calloc(m, sizeof *sz);
    if (!sz)
        return;
    for (size_t i = 0; i < m; i++)
        sz[i] = gr->results[i].status == 0 ? gr->results[i].size : 0;
    if (ga->fn(ga->arg, m, idx, sz, ga->pieces) != 0)
        for (size_t i = 0; i < m; i++)
            ga->pieces[idx[i]] = (kvp_iov){NULL, 0};
    kvp_free(sz);
}

static void get_chunk(kvp_client *c, scratch *s, const kvp_bytes *k, const size_t *idx, size_t m,
                      const kvp_iov *const *iovs, const size_t *niov, int trim,
                      const get_alloc *ga, int64_t *results)
{
    scratch_reset(s);
    uint64_t start = kvp_now_ms();
    kvp_msg_keys gk = {tenant_of(c), (uint32_t)m, (kvp_bytes *)k};
    kvp_enc_keys(&s->req, &gk);
    int rc = mcall(c, KVP_OP_GET, &s->req, RETRY_SAFE, &s->resp);
    kvp_msg_get_resp gr = {0};
    if (rc == 0)
        rc = kvp_dec_get_resp(s->resp.data, (uint32_t)s->resp.len, &c->lim, &s->a, &gr);
    if (rc == 0 && gr.n != m)
        rc = KVP_EPROTOCOL;
    if (rc) {
        for (size_t i = 0; i < m; i++)
            results[idx[i]] = rc;
        return;
    }
    uint64_t lease_end = start + gr.lease_ttl_ms;
    if (ga)
        get_chunk_alloc(ga, &gr, idx, m);

    size_t niovs = 0, nrep = 0;
    for (size_t i = 0; i < m; i++)
        if (gr.results[i].status == 0) {
            niovs += niov[idx[i]];
            nrep += gr.results[i].n_replicas;
        }
    gstate *g = kvp_calloc(m, sizeof *g);
    struct iovec *iov = kvp_calloc(niovs + 1, sizeof *iov);
    uint8_t *devs = kvp_calloc(niovs + 1, 1); /* per piece: device memory */
    kvp_xfer_op *ops = kvp_calloc(m + 1, sizeof *ops);
    size_t *opk = kvp_calloc(m + 1, sizeof *opk);
    uint64_t *segids = kvp_calloc(nrep + 1, sizeof *segids);
    kvp_bytes *relk = kvp_calloc(m, sizeof *relk);
    uint64_t *rell = kvp_calloc(m, sizeof *rell);
    kvp_bad_replica *bad = kvp_calloc(nrep + 1, sizeof *bad);
    size_t nrel = 0, nbad = 0;
    int oom = !g || !iov || !devs || !ops || !opk || !segids || !relk || !rell || !bad;

    /* Results known from the answer alone; leases to give back. */
    size_t vo = 0, ns = 0;
    int gpu = kvp_gpu_active();
    for (size_t i = 0; i < m; i++) {
        kvp_get_result *r = &gr.results[i];
        if (r->status != 0) {
            results[idx[i]] = r->status;
            continue;
        }
        if (oom) {
            results[idx[i]] = KVP_ENOMEM;
            continue;
        }
        relk[nrel] = k[i];
        rell[nrel++] = r->lease_id;
        int64_t t = pieces_total(iovs[idx[i]], niov[idx[i]]);
        if (t < 0 || (!trim && (uint64_t)t > r->size)) {
            results[idx[i]] = KVP_EINVALID_PARAMS;
            g[i].done = 1;
        } else if ((uint64_t)t < r->size) {
            results[idx[i]] = KVP_EBUFFER_OVERFLOW;
            g[i].done = 1;
        } else if (r->n_replicas == 0 || r->n_replicas > KVP_MAX_REPLICAS) {
            results[idx[i]] = KVP_EINVALID_REPLICA;
            g[i].done = 1;
        } else if ((g[i].kind_err = piece_kinds(c, gpu, iovs[idx[i]], niov[idx[i]], devs + vo,
                                                &g[i].gdev)) != 0) {
            results[idx[i]] = g[i].kind_err;
            g[i].done = 1;
        } else {
            g[i].iov = iov + vo;
            g[i].dev = g[i].gdev ? devs + vo : NULL;
            g[i].iovcnt = fit_iov(iovs[idx[i]], niov[idx[i]], r->size, g[i].iov);
            vo += niov[idx[i]]; /* devs + vo: room for every caller piece */
            g[i].last_err = KVP_EINVALID_REPLICA;
            for (uint32_t j = 0; j < r->n_replicas; j++)
                segids[ns++] = r->replicas[j].segment_id;
        }
    }
    if (!oom) {
        int drc = discover(c, segids, ns);
        if (drc)
            KVP_DEBUG(MOD, "SEGMENT_INFO: %s", kvp_strerror(drc));
        for (size_t i = 0; i < m; i++)
            if (gr.results[i].status == 0 && !g[i].done)
                order_replicas(c, &gr.results[i]);
        /* Rounds: each unserved key reads its next replica. */
        for (;;) {
            size_t no = 0;
            uint64_t now = kvp_now_ms();
            for (size_t i = 0; i < m; i++) {
                kvp_get_result *r = &gr.results[i];
                if (r->status != 0 || g[i].done)
                    continue;
                if (g[i].next >= r->n_replicas || now >= lease_end) {
                    results[idx[i]] = now >= lease_end ? KVP_ELEASE_EXPIRED : g[i].last_err;
                    g[i].done = 1;
                    continue;
                }
                kvp_replica *rep = &r->replicas[g[i].next++];
                if (rep->length != r->size) {
                    g[i].last_err = KVP_EINVALID_REPLICA;
                    i--; /* try this key's next replica in this round */
                    continue;
                }
                ops[no].rep = *rep;
                ops[no].iov = g[i].iov;
                ops[no].iovcnt = g[i].iovcnt;
                ops[no].want_csum = 1;
                ops[no].dev = g[i].dev;
                ops[no].gdev = g[i].gdev;
                ops[no].verify = g[i].dev != NULL; /* no corrupt byte reaches the device */
                ops[no].expect_csum = r->checksum;
                ops[no].status = 0;
                opk[no++] = i;
            }
            if (no == 0)
                break;
            uint64_t dl = now + c->cfg.rpc_timeout_ms;
            if (dl > lease_end)
                dl = lease_end;
            int xrc = kvp_xfer_run(c->xfer, 0, ops, no, dl);
            if (!xrc)
                report_failing(c, ops, no);
            for (size_t o = 0; o < no; o++) {
                size_t i = opk[o];
                int st = xrc ? xrc : ops[o].status;
                if (st == 0 && ops[o].csum != gr.results[i].checksum)
                    st = KVP_ECHECKSUM_MISMATCH;
                int expired = kvp_now_ms() > lease_end;
                if (st == KVP_ECHECKSUM_MISMATCH && !expired) /* within the lease: corrupt */
                    bad[nbad++] = (kvp_bad_replica){k[i], ops[o].rep.segment_id,
                                                    ops[o].rep.generation};
                if (expired) {
                    /* verified (or failed) after the lease ended: the space
                     * may already hold another value */
                    results[idx[i]] = KVP_ELEASE_EXPIRED;
                    g[i].done = 1;
                } else if (st == 0) {
                    results[idx[i]] = (int64_t)gr.results[i].size;
                    g[i].done = 1;
                } else {
                    g[i].last_err = st;
                }
            }
        }
    }
    if (nbad) { /* the master drops these replicas (and the key, if none is left) */
        scratch_reset(s);
        kvp_msg_replica_bad rb = {tenant_of(c), (uint32_t)nbad, bad};
        kvp_enc_replica_bad(&s->req, &rb);
        msend_oneway(c, KVP_OP_REPLICA_BAD, &s->req);
    }
    if (nrel) {
        scratch_reset(s);
        kvp_msg_put_end rel = {tenant_of(c), (uint32_t)nrel, relk, rell};
        kvp_enc_put_end(&s->req, &rel);
        msend_oneway(c, KVP_OP_RELEASE, &s->req);
    }
    kvp_free(g);
    kvp_free(iov);
    kvp_free(devs);
    kvp_free(ops);
    kvp_free(opk);
    kvp_free(segids);
    kvp_free(relk);
    kvp_free(bad);
    kvp_free(rell);
}

static int batch_get(kvp_client *c, const char *const *keys, const kvp_iov *const *iovs,
                     const size_t *niov, size_t n, int trim, const get_alloc *ga,
                     int64_t *results)
{
    if (!c || (n && (!keys || !iovs || !niov || !results)))
        return KVP_EINVALID_PARAMS;
    if (n == 0)
        return 0;
    kvp_bytes *k = kvp_calloc(n, sizeof *k);
    size_t *idx = kvp_calloc(n, sizeof *idx);
    if (!k || !idx) {
        kvp_free(k);
        kvp_free(idx);
        return KVP_ENOMEM;
    }
    size_t m = valid_keys(c, keys, n, k, idx, results, NULL);
    scratch s;
    scratch_init(&s);
    /* Keys only on the SSD tier answer OBJECT_LOADING while the master has
     * their node stage them in DRAM: they are asked again, backing off from
     * 0.5 to 20 ms, until rpc_timeout. Those read in a later round count
     * as disk reads. */
    uint64_t deadline = kvp_now_ms() + c->cfg.rpc_timeout_ms;
    unsigned wait_us = 500;
    for (int round = 0;; round++) {
        for (size_t off = 0; off < m;) {
            size_t l = chunk_len(c, k + off, m - off, 0, RESP_PER_GET);
            get_chunk(c, &s, k + off, idx + off, l, iovs, niov, trim, ga, results);
            off += l;
        }
        size_t nl = 0;
        uint64_t staged = 0;
        for (size_t i = 0; i < m; i++) {
            if (results[idx[i]] == KVP_EOBJECT_LOADING) {
                k[nl] = k[i];
                idx[nl++] = idx[i];
            } else if (round > 0 && results[idx[i]] >= 0) {
                staged++;
            }
        }
        if (staged)
            __atomic_fetch_add(&c->disk_reads, staged, __ATOMIC_RELAXED);
        m = nl;
        if (m == 0 || kvp_now_ms() >= deadline)
            break;
        usleep(wait_us);
        wait_us = wait_us * 2 > 20000 ? 20000 : wait_us * 2;
    }
    scratch_free(&s);
    kvp_free(k);
    kvp_free(idx);
    return 0;
}

uint64_t kvp_client_disk_reads(const kvp_client *c)
{
    return c ? __atomic_load_n(&c->disk_reads, __ATOMIC_RELAXED) : 0;
}

/* ------------------------------------------------------ transfer stats */

/* The public path numbers are xfer's (and the wire's, and the master's
 * counters' order). */
_Static_assert((int)KVP_PATH_SHM == (int)KVP_XFER_PATH_SHM &&
                   (int)KVP_PATH_TCP == (int)KVP_XFER_PATH_TCP &&
                   (int)KVP_PATH_UCX == (int)KVP_XFER_PATH_UCX &&
                   (int)KVP_NPATHS == (int)KVP_XFER_NPATHS && KVP_NPATHS == KVP_STAT_NPATHS &&
                   KVP_NPATHS <= KVP_HB_MAX_PATHS,
               "one numbering of the data paths");
_Static_assert(sizeof(kvp_path_stats) == sizeof(kvp_xfer_tally), "kvp_path_stats = kvp_xfer_tally");

const char *kvp_path_name(int path)
{
    static const char *const names[KVP_NPATHS] = {"shm", "tcp", "ucx"};
    return path >= 0 && path < KVP_NPATHS ? names[path] : NULL;
}

void kvp_transfer_stats_init(kvp_transfer_stats *s)
{
    if (!s)
        return;
    memset(s, 0, sizeof *s);
    s->struct_size = sizeof *s;
}

/* The first layout (3 paths) is the current one; a later library accepts
 * every layout from it up to its own. */
#define TRANSFER_STATS_V1 (offsetof(kvp_transfer_stats, path) + 3 * sizeof(kvp_path_stats))

int kvp_client_stats(kvp_client *c, kvp_transfer_stats *out)
{
    if (!c || !out || out->struct_size < TRANSFER_STATS_V1 || out->struct_size > sizeof *out ||
        (out->struct_size - offsetof(kvp_transfer_stats, path)) % sizeof(kvp_path_stats))
        return KVP_EINVALID_PARAMS;
    kvp_xfer_counters now;
    kvp_xfer_counts(c->xfer, &now);
    size_t n = (out->struct_size - offsetof(kvp_transfer_stats, path)) / sizeof(kvp_path_stats);
    for (size_t p = 0; p < n; p++)
        out->path[p] = (kvp_path_stats){now.path[p].put_bytes, now.path[p].get_bytes,
                                        now.path[p].put_ops, now.path[p].get_ops};
    return 0;
}

int kvp_client_batch_get_into_multi_buffers(kvp_client *c, const char *const *keys,
                                            const kvp_iov *const *iovs, const size_t *niov,
                                            size_t n, int64_t *results)
{
    return batch_get(c, keys, iovs, niov, n, 0, NULL, results);
}

int kvp_client_batch_get_into(kvp_client *c, const char *const *keys, const kvp_iov *const *iovs,
                              const size_t *niov, size_t n, int64_t *results)
{
    return batch_get(c, keys, iovs, niov, n, 1, NULL, results);
}

int kvp_client_batch_get_alloc(kvp_client *c, const char *const *keys, size_t n,
                               kvp_get_alloc_fn alloc, void *arg, int64_t *results)
{
    if (!c || !alloc || (n && (!keys || !results)))
        return KVP_EINVALID_PARAMS;
    if (n == 0)
        return 0;
    kvp_iov *pieces = kvp_calloc(n, sizeof *pieces);
    const kvp_iov **ptrs = kvp_calloc(n, sizeof *ptrs);
    size_t *ones = kvp_calloc(n, sizeof *ones);
    int rc = pieces && ptrs && ones ? 0 : KVP_ENOMEM;
    if (rc == 0) {
        for (size_t i = 0; i < n; i++) {
            ptrs[i] = &pieces[i];
            ones[i] = 1;
        }
        get_alloc ga = {alloc, arg, pieces};
        rc = batch_get(c, keys, ptrs, ones, n, 0, &ga, results);
        for (size_t i = 0; rc == 0 && i < n; i++)
            if (results[i] == KVP_EBUFFER_OVERFLOW && !pieces[i].base)
                results[i] = KVP_ENOMEM; /* the callback gave no memory */
    }
    kvp_free(pieces);
    kvp_free(ptrs);
    kvp_free(ones);
    return rc;
}

int64_t kvp_client_get(kvp_client *c, const char *key, void *buf, size_t cap)
{
    if (cap && !buf)
        return KVP_EINVALID_PARAMS;
    kvp_iov v = {buf, cap};
    const kvp_iov *vp = &v;
    size_t one = 1;
    int64_t r = 0;
    int rc = batch_get(c, &key, &vp, &one, 1, 1, NULL, &r);
    return rc ? rc : r;
}

/* GET one key; on success *gr holds its answer (in s) and the lease is
 * released before returning (the caller only wants metadata). */
static int get_meta(kvp_client *c, scratch *s, const char *key, kvp_get_result *out)
{
    kvp_bytes k;
    int rc = key_bytes(c, key, &k);
    if (rc)
        return rc;
    kvp_msg_keys gk = {tenant_of(c), 1, &k};
    kvp_enc_keys(&s->req, &gk);
    rc = mcall(c, KVP_OP_GET, &s->req, RETRY_SAFE, &s->resp);
    kvp_msg_get_resp gr = {0};
    if (rc == 0)
        rc = kvp_dec_get_resp(s->resp.data, (uint32_t)s->resp.len, &c->lim, &s->a, &gr);
    if (rc == 0 && gr.n != 1)
        rc = KVP_EPROTOCOL;
    if (rc)
        return rc;
    *out = gr.results[0];
    if (out->status == KVP_EOBJECT_LOADING) /* on the SSD tier: size and checksum known */
        return 0;
    if (out->status)
        return out->status;
    scratch_reset(s);
    kvp_msg_put_end rel = {tenant_of(c), 1, &k, &out->lease_id};
    kvp_enc_put_end(&s->req, &rel);
    msend_oneway(c, KVP_OP_RELEASE, &s->req);
    return 0;
}

int kvp_client_batch_size(kvp_client *c, const char *const *keys, size_t n, int64_t *results)
{
    if (!c || (n && (!keys || !results)))
        return KVP_EINVALID_PARAMS;
    if (n == 0)
        return 0;
    kvp_bytes *k = kvp_calloc(n, sizeof *k);
    size_t *idx = kvp_calloc(n, sizeof *idx);
    uint64_t *lease = kvp_calloc(n, sizeof *lease);
    kvp_bytes *relk = kvp_calloc(n, sizeof *relk);
    if (!k || !idx || !lease || !relk) {
        kvp_free(k);
        kvp_free(idx);
        kvp_free(lease);
        kvp_free(relk);
        return KVP_ENOMEM;
    }
    size_t m = valid_keys(c, keys, n, k, idx, results, NULL);
    scratch s;
    scratch_init(&s);
    for (size_t off = 0; off < m;) {
        size_t l = chunk_len(c, k + off, m - off, 0, RESP_PER_GET);
        scratch_reset(&s);
        kvp_msg_keys q = {tenant_of(c), (uint32_t)l, k + off};
        kvp_enc_keys(&s.req, &q);
        int rc = mcall(c, KVP_OP_GET, &s.req, RETRY_SAFE, &s.resp);
        kvp_msg_get_resp gr = {0};
        if (rc == 0)
            rc = kvp_dec_get_resp(s.resp.data, (uint32_t)s.resp.len, &c->lim, &s.a, &gr);
        if (rc == 0 && gr.n != l)
            rc = KVP_EPROTOCOL;
        size_t nrel = 0;
        for (size_t i = 0; i < l; i++) {
            const kvp_get_result *r = rc ? NULL : &gr.results[i];
            if (r && (r->status == 0 || r->status == KVP_EOBJECT_LOADING)) {
                /* a key on the SSD tier has its size known without waiting */
                results[idx[off + i]] = r->size > (uint64_t)INT64_MAX ? KVP_EPROTOCOL
                                                                       : (int64_t)r->size;
                if (r->status == 0) {
                    relk[nrel] = k[off + i];
                    lease[nrel++] = r->lease_id;
                }
            } else {
                results[idx[off + i]] = rc ? rc : r->status;
            }
        }
        if (nrel) {
            scratch_reset(&s);
            kvp_msg_put_end rel = {tenant_of(c), (uint32_t)nrel, relk, lease};
            kvp_enc_put_end(&s.req, &rel);
            msend_oneway(c, KVP_OP_RELEASE, &s.req);
        }
        off += l;
    }
    scratch_free(&s);
    kvp_free(k);
    kvp_free(idx);
    kvp_free(lease);
    kvp_free(relk);
    return 0;
}

int64_t kvp_client_size(kvp_client *c, const char *key)
{
    if (!c)
        return KVP_EINVALID_PARAMS;
    scratch s;
    scratch_init(&s);
    kvp_get_result r;
    int rc = get_meta(c, &s, key, &r);
    scratch_free(&s);
    return rc ? rc : (int64_t)r.size;
}

/* Appends printf output at *w of buf[0..len) (counting past the end). */
static void appendf(char *buf, size_t len, size_t *w, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void appendf(char *buf, size_t len, size_t *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(*w < len ? buf + *w : NULL, *w < len ? len - *w : 0, fmt, ap);
    va_end(ap);
    *w += n > 0 ? (size_t)n : 0;
}

/* Appends s as the body of a JSON string (no quotes). */
static void append_json_str(char *buf, size_t len, size_t *w, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\')
            appendf(buf, len, w, "\\%c", ch);
        else if (ch < 32 || ch == 127)
            appendf(buf, len, w, "\\u%04x", ch);
        else /* ASCII, and UTF-8 passed through (a key is the caller's UTF-8 text) */
            appendf(buf, len, w, "%c", ch);
    }
}

/*
 * describe / describe_json: the key's replicas (GET + RELEASE), their
 * segments' names (SEGMENT_INFO) and the transport this client would use.
 */
static int describe(kvp_client *c, const char *key, int json, char *buf, size_t len)
{
    if (!c || (len && !buf))
        return KVP_EINVALID_PARAMS;
    scratch s;
    scratch_init(&s);
    kvp_get_result r;
    int rc = get_meta(c, &s, key, &r);
    if (rc) {
        scratch_free(&s);
        return rc;
    }
    uint64_t ids[KVP_MAX_REPLICAS];
    uint32_t nr = r.n_replicas <= KVP_MAX_REPLICAS ? r.n_replicas : KVP_MAX_REPLICAS;
    for (uint32_t j = 0; j < nr; j++)
        ids[j] = r.replicas[j].segment_id;
    /* SEGMENT_INFO for names (asked even for known segments: xfer keeps no names). */
    scratch_reset(&s);
    kvp_msg_ids q = {nr, ids};
    kvp_enc_ids(&s.req, &q);
    kvp_msg_seg_info_resp si = {0};
    int src = nr ? mcall(c, KVP_OP_SEGMENT_INFO, &s.req, RETRY_SAFE, &s.resp) : 0;
    if (src == 0 && nr)
        src = kvp_dec_seg_info_resp(s.resp.data, (uint32_t)s.resp.len, &c->lim, &s.a, &si);
    if (src == 0 && si.n != nr)
        src = KVP_EPROTOCOL;
    for (uint32_t j = 0; src == 0 && j < nr; j++)
        if (si.infos[j].status == 0 && !kvp_xfer_has_segment(c->xfer, ids[j]))
            kvp_xfer_add_segment(c->xfer, &si.infos[j].desc);
    size_t w = 0;
    int on_disk = r.status == KVP_EOBJECT_LOADING, tier = 0;
    if (kvp_client_tiers(c, &key, 1, &tier) != 0 || tier < 0)
        tier = 0;
    if (json) {
        appendf(buf, len, &w, "{\"key\": \"");
        append_json_str(buf, len, &w, key, strlen(key));
        appendf(buf, len, &w, "\", \"size\": %llu, \"tier\": \"%s\", \"replicas\": [",
                (unsigned long long)r.size, on_disk ? "disk" : "dram");
    } else {
        appendf(buf, len, &w, "size %llu%s", (unsigned long long)r.size,
                on_disk ? "; tier disk (being staged into DRAM)" : "");
    }
    for (uint32_t j = 0; j < nr; j++) {
        const kvp_replica *p = &r.replicas[j];
        char name[300] = "?";
        if (src == 0 && si.infos[j].status == 0) {
            kvp_bytes nm = si.infos[j].desc.name;
            snprintf(name, sizeof name, "%.*s", (int)nm.len, (const char *)nm.p);
        }
        const char *via = kvp_xfer_transport(c->xfer, p->segment_id);
        if (json) {
            appendf(buf, len, &w, "%s{\"segment\": \"%016llx\", \"name\": \"", j ? ", " : "",
                    (unsigned long long)p->segment_id);
            append_json_str(buf, len, &w, name, strlen(name));
            appendf(buf, len, &w,
                    "\", \"offset\": %llu, \"length\": %llu, \"tier\": \"dram\", "
                    "\"transport\": \"%s\"}",
                    (unsigned long long)p->offset, (unsigned long long)p->length,
                    via ? via : "none");
        } else {
            appendf(buf, len, &w, "; replica %u/%u: segment %016llx (%s) offset %llu tier dram via %s",
                    j + 1, nr, (unsigned long long)p->segment_id, name,
                    (unsigned long long)p->offset, via ? via : "none");
        }
    }
    if (tier & KVP_TIER_DISK) { /* the record on a node's SSD tier */
        if (json)
            appendf(buf, len, &w, "%s{\"tier\": \"disk\", \"length\": %llu}", nr ? ", " : "",
                    (unsigned long long)r.size);
        else
            appendf(buf, len, &w, "; a durable copy on the SSD tier");
    }
    if (json)
        appendf(buf, len, &w, "]}");
    scratch_free(&s);
    if (w >= len)
        return KVP_EBUFFER_OVERFLOW;
    return (int)w;
}

int kvp_client_describe(kvp_client *c, const char *key, char *buf, size_t len)
{
    return describe(c, key, 0, buf, len);
}

int kvp_client_describe_json(kvp_client *c, const char *key, char *buf, size_t len)
{
    return describe(c, key, 1, buf, len);
}

/* --------------------------------------------------------------- stats */

int kvp_client_stat(kvp_client *c, char *buf, size_t len)
{
    if (!c || (len && !buf))
        return KVP_EINVALID_PARAMS;
    scratch s;
    scratch_init(&s);
    int rc = mcall(c, KVP_OP_STATS, &s.req, RETRY_SAFE, &s.resp);
    kvp_msg_stats_resp st;
    if (rc == 0)
        rc = kvp_dec_stats_resp(s.resp.data, (uint32_t)s.resp.len, &c->lim, &s.a, &st);
    /* a master before the per-path counters answers without them */
    if (rc == 0 && st.n_counters < KVP_STAT_SHM_PUT_BYTES)
        rc = KVP_EPROTOCOL;
    size_t w = 0;
    if (rc == 0) {
        appendf(buf, len, &w, "{\"counters\": {");
        for (uint32_t i = 0; i < KVP_STAT__COUNT && i < st.n_counters; i++)
            appendf(buf, len, &w, "%s\"%s\": %llu", i ? ", " : "", kvp_stat_name(i),
                    (unsigned long long)st.counters[i]);
        appendf(buf, len, &w, "}, \"segments\": [");
        for (uint32_t i = 0; i < st.n_segs; i++) {
            const kvp_seg_stat *g = &st.segs[i];
            appendf(buf, len, &w, "%s{\"id\": \"%016llx\", \"name\": \"", i ? ", " : "",
                    (unsigned long long)g->id);
            append_json_str(buf, len, &w, (const char *)g->name.p, g->name.len);
            appendf(buf, len, &w,
                    "\", \"capacity\": %llu, \"used\": %llu, \"objects\": %llu, "
                    "\"largest_free\": %llu}",
                    (unsigned long long)g->capacity, (unsigned long long)g->used,
                    (unsigned long long)g->objects, (unsigned long long)g->largest_free);
        }
        appendf(buf, len, &w, "], \"tenants\": [");
        for (uint32_t i = 0; i < st.n_tenants; i++) {
            const kvp_tenant_stat *t = &st.tenants[i];
            appendf(buf, len, &w, "%s{\"name\": \"", i ? ", " : "");
            append_json_str(buf, len, &w, (const char *)t->name.p, t->name.len);
            appendf(buf, len, &w,
                    "\", \"objects\": %llu, \"bytes\": %llu, \"pool_bytes\": %llu, "
                    "\"max_bytes\": %llu, \"max_objects\": %llu, \"share\": %u, "
                    "\"evictions\": %llu, \"refused\": %llu}",
                    (unsigned long long)t->objects, (unsigned long long)t->bytes,
                    (unsigned long long)t->pool_bytes, (unsigned long long)t->max_bytes,
                    (unsigned long long)t->max_objects, t->share,
                    (unsigned long long)t->evictions, (unsigned long long)t->refused);
        }
        appendf(buf, len, &w, "]}");
    }
    scratch_free(&s);
    if (rc)
        return rc;
    if (w >= len)
        return KVP_EBUFFER_OVERFLOW;
    return (int)w;
}

const char *kvp_client_segment_name(const kvp_client *c) { return c ? c->seg_name : ""; }

const char *kvp_client_tenant(const kvp_client *c) { return c ? c->cfg.tenant : ""; }

/* ---------------------------------------------------- exist and prefix */

/*
 * A per-key-code request over a batch: EXIST (force < 0) or REMOVE (force
 * 0 / 1). Invalid keys get their own code; the rest go in frame-sized chunks.
 */
static int codes_batch(kvp_client *c, const char *const *keys, size_t n, int force,
                       int *results)
{
    if (!c || (n && (!keys || !results)))
        return KVP_EINVALID_PARAMS;
    if (n == 0)
        return 0;
    kvp_bytes *k = kvp_calloc(n, sizeof *k);
    size_t *idx = kvp_calloc(n, sizeof *idx);
    if (!k || !idx) {
        kvp_free(k);
        kvp_free(idx);
        return KVP_ENOMEM;
    }
    size_t m = valid_keys(c, keys, n, k, idx, NULL, results);
    scratch s;
    scratch_init(&s);
    for (size_t off = 0; off < m;) {
        size_t l = chunk_len(c, k + off, m - off, 0, RESP_PER_CODE);
        scratch_reset(&s);
        int rc;
        if (force < 0) {
            kvp_msg_keys q = {tenant_of(c), (uint32_t)l, k + off};
            kvp_enc_keys(&s.req, &q);
            rc = mcall(c, force == -2 ? KVP_OP_TIERS : KVP_OP_EXIST, &s.req, RETRY_SAFE,
                       &s.resp);
        } else {
            kvp_msg_remove q = {tenant_of(c), (uint8_t)(force != 0), (uint32_t)l, k + off};
            kvp_enc_remove(&s.req, &q);
            rc = mcall(c, KVP_OP_REMOVE, &s.req, RETRY_SAFE, &s.resp);
        }
        kvp_msg_results r = {0};
        if (rc == 0)
            rc = kvp_dec_results(s.resp.data, (uint32_t)s.resp.len, &c->lim, &s.a, &r);
        if (rc == 0 && r.n != l)
            rc = KVP_EPROTOCOL;
        for (size_t i = 0; i < l; i++)
            results[idx[off + i]] = rc ? rc : r.codes[i];
        off += l;
    }
    scratch_free(&s);
    kvp_free(k);
    kvp_free(idx);
    return 0;
}

int kvp_client_exist(kvp_client *c, const char *const *keys, size_t n, int *results)
{
    return codes_batch(c, keys, n, -1, results);
}

int kvp_client_offload(const kvp_client *c) { return c && c->cfg.enable_offload; }

int kvp_client_tiers(kvp_client *c, const char *const *keys, size_t n, int *results)
{
    return codes_batch(c, keys, n, -2, results);
}

/*
 * EXIST_LEASE over a batch, in frame-sized chunks (each its own request: a
 * chunk's leases are granted when the master answers it). A chunk that
 * failed as a whole gives its keys its code; a master that does not know
 * the operation (an older release: UNKNOWN_OP) stops the call with
 * KVP_ENOT_SUPPORTED, so the caller can fall back to kvp_client_exist.
 */
int kvp_client_exist_lease(kvp_client *c, const char *const *keys, size_t n, int *present_out,
                           uint64_t *sizes_out)
{
    if (!c || (n && (!keys || !present_out || !sizes_out)))
        return KVP_EINVALID_PARAMS;
    if (n == 0)
        return 0;
    kvp_bytes *k = kvp_calloc(n, sizeof *k);
    size_t *idx = kvp_calloc(n, sizeof *idx);
    if (!k || !idx) {
        kvp_free(k);
        kvp_free(idx);
        return KVP_ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        sizes_out[i] = 0;
    size_t m = valid_keys(c, keys, n, k, idx, NULL, present_out);
    scratch s;
    scratch_init(&s);
    int ret = 0;
    for (size_t off = 0; off < m;) {
        size_t l = chunk_len(c, k + off, m - off, 0, RESP_PER_XL);
        scratch_reset(&s);
        kvp_msg_keys q = {tenant_of(c), (uint32_t)l, k + off};
        kvp_enc_keys(&s.req, &q);
        int rc = mcall(c, KVP_OP_EXIST_LEASE, &s.req, RETRY_SAFE, &s.resp);
        if (rc == KVP_EUNKNOWN_OP) {
            ret = KVP_ENOT_SUPPORTED;
            break;
        }
        kvp_msg_exist_lease_resp r = {0};
        if (rc == 0)
            rc = kvp_dec_exist_lease_resp(s.resp.data, (uint32_t)s.resp.len, &c->lim, &s.a, &r);
        if (rc == 0 && r.n != l)
            rc = KVP_EPROTOCOL;
        for (size_t i = 0; i < l; i++) {
            size_t j = idx[off + i];
            if (rc) {
                present_out[j] = rc;
                continue;
            }
            const kvp_xl_ent *e = &r.ents[i];
            present_out[j] = e->state == KVP_XL_LEASED ? KVP_TIER_DRAM
                             : e->state == KVP_XL_DISK ? KVP_TIER_DISK
                                                       : 0;
            sizes_out[j] = e->size;
        }
        off += l;
    }
    scratch_free(&s);
    kvp_free(k);
    kvp_free(idx);
    return ret;
}

int64_t kvp_client_prefix(kvp_client *c, const char *const *keys, size_t n)
{
    if (!c || (n && !keys))
        return KVP_EINVALID_PARAMS;
    /* Only the keys before the first invalid one can count. */
    kvp_bytes *k = kvp_calloc(n + 1, sizeof *k);
    if (!k)
        return KVP_ENOMEM;
    size_t m = 0;
    while (m < n && key_bytes(c, keys[m], &k[m]) == 0)
        m++;
    scratch s;
    scratch_init(&s);
    int64_t total = 0;
    for (size_t off = 0; off < m;) {
        size_t l = chunk_len(c, k + off, m - off, 0, 0);
        scratch_reset(&s);
        kvp_msg_keys q = {tenant_of(c), (uint32_t)l, k + off};
        kvp_enc_keys(&s.req, &q);
        int rc = mcall(c, KVP_OP_PREFIX, &s.req, RETRY_SAFE, &s.resp);
        kvp_msg_prefix_resp r = {0};
        if (rc == 0)
            rc = kvp_dec_prefix_resp(s.resp.data, (uint32_t)s.resp.len, &r);
        if (rc == 0 && r.count > l)
            rc = KVP_EPROTOCOL;
        if (rc) {
            total = rc;
            break;
        }
        total += r.count;
        if (r.count < l)
            break;
        off += l;
    }
    scratch_free(&s);
    kvp_free(k);
    return total;
}

/* ----------------------------------------------------- engine KV blocks */

#define LOOKUP_CHUNK 65536 /* hashes per LOOKUP_HASHES request (whole chains) */

int kvp_client_lookup_hashes(kvp_client *c, const uint64_t *hashes, const size_t *lens,
                             const uint8_t *groups, size_t nchains, kvp_hash_prefix *out)
{
    if (!c || (nchains && (!lens || !out)))
        return KVP_EINVALID_PARAMS;
    size_t total = 0;
    for (size_t i = 0; i < nchains; i++) {
        if (lens[i] > c->lim.max_batch || total + lens[i] < total)
            return KVP_ETOO_LARGE;
        total += lens[i];
    }
    if (total && !hashes)
        return KVP_EINVALID_PARAMS;
    kvp_hchain *ch = kvp_calloc(nchains + 1, sizeof *ch);
    if (!ch)
        return KVP_ENOMEM;
    const uint64_t *h = hashes;
    for (size_t i = 0; i < nchains; i++) {
        ch[i] = (kvp_hchain){groups ? groups[i] : 0, (uint32_t)lens[i], (uint64_t *)h};
        h += lens[i];
    }
    scratch s;
    scratch_init(&s);
    int rc = 0;
    for (size_t off = 0; off < nchains && rc == 0;) {
        size_t l = 0, sum = 0; /* at least one chain, whole chains up to LOOKUP_CHUNK */
        while (off + l < nchains && (l == 0 || sum + ch[off + l].n <= LOOKUP_CHUNK))
            sum += ch[off + l++].n;
        scratch_reset(&s);
        kvp_msg_lookup_hashes q = {tenant_of(c), (uint32_t)l, ch + off};
        kvp_enc_lookup_hashes(&s.req, &q);
        rc = mcall(c, KVP_OP_LOOKUP_HASHES, &s.req, RETRY_SAFE, &s.resp);
        kvp_msg_lookup_hashes_resp r = {0};
        if (rc == 0)
            rc = kvp_dec_lookup_hashes_resp(s.resp.data, (uint32_t)s.resp.len, &c->lim, &s.a, &r);
        if (rc == 0 && r.n != l)
            rc = KVP_EPROTOCOL;
        for (size_t i = 0; rc == 0 && i < l; i++) {
            const kvp_hprefix *p = &r.prefix[i];
            if (p->dram > ch[off + i].n || p->disk > ch[off + i].n || p->any > ch[off + i].n)
                rc = KVP_EPROTOCOL;
            else
                out[off + i] = (kvp_hash_prefix){p->dram, p->disk, p->any};
        }
        off += l;
    }
    scratch_free(&s);
    kvp_free(ch);
    return rc;
}

int64_t kvp_client_kv_snapshot(kvp_client *c, uint64_t *seq, kvp_snapshot_fn fn, void *arg)
{
    if (!c || !seq || !fn)
        return KVP_EINVALID_PARAMS;
    scratch s;
    scratch_init(&s);
    kvp_msg_keys q = {tenant_of(c), 0, NULL};
    kvp_enc_keys(&s.req, &q);
    int rc = mcall(c, KVP_OP_KV_SNAPSHOT, &s.req, RETRY_SAFE, &s.resp);
    kvp_msg_kv_snapshot_resp r = {0};
    if (rc == 0)
        rc = kvp_dec_kv_snapshot_resp(s.resp.data, (uint32_t)s.resp.len, &c->lim, &s.a, &r);
    int64_t n = rc;
    if (rc == 0) {
        *seq = r.seq;
        for (uint32_t i = 0; i < r.n; i++)
            fn(arg, r.blocks[i].hash, r.blocks[i].group, r.blocks[i].tier);
        n = r.n;
    }
    scratch_free(&s);
    return n;
}

/* -------------------------------------------------------------- remove */

int kvp_client_remove(kvp_client *c, const char *key, int force)
{
    int r = 0;
    int rc = codes_batch(c, &key, 1, force != 0, &r);
    return rc ? rc : r;
}

int kvp_client_batch_remove(kvp_client *c, const char *const *keys, size_t n, int force,
                            int *results)
{
    return codes_batch(c, keys, n, force != 0, results);
}

int64_t kvp_client_remove_all(kvp_client *c, int force)
{
    if (!c)
        return KVP_EINVALID_PARAMS;
    scratch s;
    scratch_init(&s);
    kvp_msg_remove_all q = {tenant_of(c), (uint8_t)(force != 0)};
    kvp_enc_remove_all(&s.req, &q);
    int rc = mcall(c, KVP_OP_REMOVE_ALL, &s.req, RETRY_SAFE, &s.resp);
    kvp_msg_remove_all_resp r = {0};
    if (rc == 0)
        rc = kvp_dec_remove_all_resp(s.resp.data, (uint32_t)s.resp.len, &r);
    scratch_free(&s);
    if (rc)
        return rc;
    return r.removed > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)r.removed;
}

int64_t kvp_client_remove_regex(kvp_client *c, const char *pattern, int force)
{
    if (!c || !pattern)
        return KVP_EINVALID_PARAMS;
    size_t len = strnlen(pattern, KVP_REGEX_MAX + 1);
    if (len == 0 || len > KVP_REGEX_MAX)
        return KVP_EINVALID_PARAMS;
    scratch s;
    scratch_init(&s);
    kvp_msg_remove_regex q = {tenant_of(c), (uint8_t)(force != 0),
                              {(const uint8_t *)pattern, (uint32_t)len}};
    kvp_enc_remove_regex(&s.req, &q);
    int rc = mcall(c, KVP_OP_REMOVE_REGEX, &s.req, RETRY_SAFE, &s.resp);
    kvp_msg_remove_all_resp r = {0};
    if (rc == 0)
        rc = kvp_dec_remove_all_resp(s.resp.data, (uint32_t)s.resp.len, &r);
    scratch_free(&s);
    if (rc)
        return rc;
    return r.removed > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)r.removed;
}

/* ---------------------------------------------------- registered buffers */

/* Index of the first range with base > p. Caller holds reg_mu. */
static size_t reg_upper(const kvp_client *c, uintptr_t p)
{
    size_t lo = 0, hi = c->nregs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->regs[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/*
 * What a range is, decided once here: device memory (of which device), or
 * host memory mapped read-write in this process. Anything else is refused
 * with the reason logged: memory that is neither would fault the first
 * transfer.
 */
static int classify_region(const void *base, size_t len, struct kvp_gpu_dev **dev)
{
    int k = kvp_gpu_classify(base, len, dev);
    if (k < 0) {
        KVP_WARN(MOD, "register_buffer(%p, %zu): %s (%s)", base, len,
                 k == KVP_EDEVICE ? "the CUDA driver cannot tell what this memory is"
                                  : "device memory crossing the end of its allocation",
                 kvp_gpu_status());
        return k;
    }
    if (k == 0 && !kvp_gpu_host_mapped(base, len)) {
        KVP_WARN(MOD, "register_buffer(%p, %zu): not host memory mapped read-write in this "
                      "process, nor device memory the CUDA driver knows (%s)",
                 base, len, kvp_gpu_status());
        return KVP_EINVALID_PARAMS;
    }
    return 0;
}

int kvp_client_register_buffer(kvp_client *c, void *base, size_t len)
{
    if (!c || !base || len == 0)
        return KVP_EINVALID_PARAMS;
    uintptr_t b = (uintptr_t)base;
    if (len > UINTPTR_MAX - b)
        return KVP_EINVALID_PARAMS;
    struct kvp_gpu_dev *dev = NULL;
    int crc = classify_region(base, len, &dev);
    if (crc)
        return crc;
    pthread_mutex_lock(&c->reg_mu);
    size_t i = reg_upper(c, b);
    int rc = 0;
    if ((i > 0 && c->regs[i - 1].base + c->regs[i - 1].len > b) ||
        (i < c->nregs && c->regs[i].base < b + len)) {
        rc = KVP_EINVALID_PARAMS; /* overlaps a registered range */
    } else if (c->nregs == c->cap_regs) {
        size_t nc = c->cap_regs ? c->cap_regs * 2 : 16;
        kvp_creg *nr = kvp_realloc(c->regs, nc * sizeof *nr);
        if (!nr)
            rc = KVP_ENOMEM;
        else {
            c->regs = nr;
            c->cap_regs = nc;
        }
    }
    if (rc == 0) {
        memmove(c->regs + i + 1, c->regs + i, (c->nregs - i) * sizeof *c->regs);
        c->regs[i].base = b;
        c->regs[i].len = len;
        c->regs[i].dev = dev;
        c->nregs++;
        if (dev)
            __atomic_add_fetch(&c->ndevregs, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&c->reg_mu);
    return rc;
}

int kvp_client_unregister_buffer(kvp_client *c, void *base)
{
    if (!c || !base)
        return KVP_EINVALID_PARAMS;
    uintptr_t b = (uintptr_t)base;
    pthread_mutex_lock(&c->reg_mu);
    size_t i = reg_upper(c, b);
    int rc = KVP_EINVALID_PARAMS; /* not a registered base */
    if (i > 0 && c->regs[i - 1].base == b) {
        if (c->regs[i - 1].dev)
            __atomic_sub_fetch(&c->ndevregs, 1, __ATOMIC_RELEASE);
        memmove(c->regs + i - 1, c->regs + i, (c->nregs - i) * sizeof *c->regs);
        c->nregs--;
        rc = 0;
    }
    pthread_mutex_unlock(&c->reg_mu);
    return rc;
}

int kvp_client_check_registered(kvp_client *c, const kvp_iov *v, size_t n)
{
    if (!c || (n && !v))
        return KVP_EINVALID_PARAMS;
    int rc = 0;
    pthread_mutex_lock(&c->reg_mu);
    for (size_t i = 0; i < n && rc == 0; i++) {
        uintptr_t b = (uintptr_t)v[i].base;
        if (!b || v[i].len > UINTPTR_MAX - b) {
            rc = KVP_EINVALID_PARAMS;
            break;
        }
        size_t j = reg_upper(c, b); /* regs[j-1] is the last range starting at or below b */
        if (j == 0 || b + v[i].len > c->regs[j - 1].base + c->regs[j - 1].len)
            rc = KVP_EINVALID_PARAMS;
    }
    pthread_mutex_unlock(&c->reg_mu);
    return rc;
}
