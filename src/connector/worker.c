/*
 * worker.c -- MooncakeStoreWorker in C (spec §10-§12). See worker.h for the
 * contracts; this file's internal invariants:
 *   - one mutex (w->lock) guards the queues, the per-request send state,
 *     the pressure gate, the finished-receiving set, the load-error ids, the
 *     stats and the events. No store call is made while holding it.
 *   - a send job exists only while its request's entry counts it in
 *     `inflight`; the entry lives until the request is reported finished
 *     (or preempted with nothing in flight).
 *   - send_cur is the job the send thread runs; rrun lists the load jobs the
 *     receive threads run (both set and cleared under the lock), so
 *     handle_preemptions and the aborted-load rule can wait for them.
 *   - an id is in `aborted` from the get_finished that saw it finished with
 *     its load pending until the get_finished that reports it in
 *     done_sending; the store rule skips such ids (reported exactly once).
 *   - jobs own deep copies of everything they read from the step metadata.
 *   - the store client comes from w->link (poollink.h) for each operation;
 *     when it hands out none the pool is unavailable and the operation is
 *     done without it (skipped store, failed load, lookup miss), counted
 *     there. A failure that looks like the master's outage is reported to
 *     the link (kvp_plink_check), which logs it once, not per request.
 */
#include "connector/worker.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/assert.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "connector/poollink.h"

#define MOD "worker"
#define STAGING_ALIGN 4096u
#define STAGING_PAD 8192u

/* ------------------------------------------------------------ jobs */

typedef struct job {
    struct job *next;
    char *req_id;
    uint64_t gen;  /* send jobs: the request entry's generation at enqueue */
    uint64_t step; /* the get_finished call that enqueued it (fence argument) */
    uint64_t token_len_chunk;
    uint32_t ngroups;
    uint32_t **bids; /* ngroups arrays */
    uint32_t *nbids;
    uint8_t *hashes;
    uint32_t nhashes;
    uint8_t hash_len;
    kvp_meta_load_spec ls; /* loads */
    uint32_t *token_ids;   /* NULL = None */
    uint32_t n_token_ids;
    int64_t num_prompt_tokens; /* < 0 = None */
    kvp_meta_tail *tails;      /* NULL = None */
    uint32_t ntails;
} job;

static void job_free(job *j)
{
    if (!j)
        return;
    if (j->bids)
        for (uint32_t g = 0; g < j->ngroups; g++)
            kvp_free(j->bids[g]);
    kvp_free(j->bids);
    kvp_free(j->nbids);
    kvp_free(j->hashes);
    kvp_free(j->token_ids);
    kvp_free(j->tails);
    kvp_free(j->req_id);
    kvp_free(j);
}

static void *dup_mem(const void *p, size_t n)
{
    void *q = kvp_malloc(n ? n : 1);
    if (q && n)
        memcpy(q, p, n);
    return q;
}

static job *job_from_req(const kvp_meta_req *r)
{
    job *j = kvp_calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->req_id = kvp_strndup(r->req_id.p, r->req_id.len);
    j->token_len_chunk = r->token_len_chunk;
    j->ngroups = r->ngroups;
    j->bids = kvp_calloc(r->ngroups ? r->ngroups : 1, sizeof *j->bids);
    j->nbids = kvp_calloc(r->ngroups ? r->ngroups : 1, sizeof *j->nbids);
    j->hash_len = r->hash_len;
    j->nhashes = r->nhashes;
    j->hashes = dup_mem(r->block_hashes, (size_t)r->nhashes * r->hash_len);
    j->num_prompt_tokens = r->has_num_prompt_tokens ? (int64_t)r->num_prompt_tokens : -1;
    if (!j->req_id || !j->bids || !j->nbids || !j->hashes)
        goto fail;
    for (uint32_t g = 0; g < r->ngroups; g++) {
        j->nbids[g] = r->block_ids[g].n;
        j->bids[g] = dup_mem(r->block_ids[g].ids, (size_t)r->block_ids[g].n * sizeof(uint32_t));
        if (!j->bids[g])
            goto fail;
    }
    if (r->load_spec)
        j->ls = *r->load_spec;
    if (r->token_ids) {
        j->token_ids = dup_mem(r->token_ids, (size_t)r->n_token_ids * sizeof(uint32_t));
        j->n_token_ids = r->n_token_ids;
        if (!j->token_ids)
            goto fail;
    }
    if (r->tails) {
        j->tails = dup_mem(r->tails, (size_t)r->ntails * sizeof(kvp_meta_tail));
        j->ntails = r->ntails;
        if (!j->tails)
            goto fail;
    }
    return j;
fail:
    job_free(j);
    return NULL;
}

/* Per-request send state (the spec's stored_requests / _saved_offset /
 * _skip_store_requests, and the finished-but-in-flight set). */
typedef struct sreq {
    char *id;
    uint32_t inflight;
    uint64_t saved; /* tokens persisted by this rank (resume offset) */
    uint64_t gen;   /* bumped on preemption: older jobs are dropped */
    int skip;       /* pressure back-off */
    int finished;   /* engine finished it; report once inflight == 0 */
    int detached;   /* preempted with jobs in flight and not saved since: the
                       scheduler did not delay its free (§8.5), so it must
                       never appear in finished_sending; dropped silently */
} sreq;

struct kvp_worker {
    int capacity_only;
    int role;
    int can_put;            /* a PRODUCER / BOTH role, or save_decode_cache: saves
                               (the send thread runs) */
    int tp_rank, tp_size, pcp_size, dcp_size, pp_size;
    int eagle_prefix_hashing, enable_kv_events;
    int *block_group;       /* pool_blocks: per group, the engine's index in a put's
                               kvp_block (-1: stored without its block); NULL: off */
    int use_eagle;          /* speculative_config.use_eagle(): the Mamba checkpoint rule */
    uint64_t staging_budget;
    double staging_ratio;   /* usable share of it ($VLLM_MOONCAKE_DISK_STAGING_USABLE_RATIO) */
    int tier_log;           /* $VLLM_MOONCAKE_STORE_TIER_LOG: each load's tiers logged */
    unsigned nrecv;
    kvp_worker_fence_fn fence;
    void *fence_arg;

    kvp_plink *link; /* the store client and the pool's availability (poollink.h):
                        every store call takes the client from it, and does
                        without the pool when it hands out none */
    char *cfg_key;   /* the configuration descriptor's key and JSON (NULL: this
                        worker puts none: not rank 0 of a storing role) */
    char *cfg_desc;
    uint64_t cfg_epoch; /* atomic: the link epoch it was last put in */
    uint64_t cfg_next_ms; /* atomic: when it is put again (put_config_object) */
    struct kvp_coord *coord;
    uint32_t L, H;
    size_t ng;
    uint32_t *B;     /* per group block size */
    int *factor;     /* per group TP replication factor = put step (with by_head:
                        the ranks holding each of this rank's heads) */
    int by_head;     /* the TP-independent layout (kvp_worker_cfg.tp_independent) */
    uint32_t nloc;   /* by_head: heads per rank (every group), layout.heads */
    char **hprefix;  /* by_head: per group, nloc NUL-terminated prefixes back to
                        back (this rank's heads, in order) */
    size_t **hprefix_off;
    char **prefix;   /* per group own key prefix */
    size_t *prefix_len;
    char **lk_buf;   /* per group lookup prefixes, NUL-separated */
    size_t **lk_off;
    size_t *lk_n;
    kvp_tdb_layout layout;
    int layout_ok;
    kvp_tdb *tdb;
    int registered;

    pthread_mutex_t lock;
    pthread_cond_t send_cv, recv_cv, idle_cv;
    job *sq_head, *sq_tail, *rq_head, *rq_tail;
    size_t send_busy, recv_busy; /* queued + running */
    int stop;
    pthread_t send_th;
    int send_started;
    pthread_t *recv_th;
    unsigned recv_started;
    uint64_t step;  /* get_finished calls so far */
    job *send_cur;  /* the store job the send thread runs, or NULL */
    job *rrun;      /* load jobs the receive threads run (linked by next) */
    kvp_worker_ids had_load; /* live requests a step asked to load (every
                                rank sees the same steps, so every rank
                                agrees on this set) */
    kvp_worker_ids aborted; /* finished after a load was asked for: reported
                               in done_sending once that load ended */

    sreq *reqs;
    size_t nreqs, capreqs;
    int pressure;

    kvp_worker_ids recv_done;
    job *unreported; /* finished loads whose id could not be recorded (out of
                        memory): retried by every get_finished, never lost */
    uint32_t *lerr;
    size_t nlerr, caplerr;
    kvp_worker_ids lfail; /* requests with a failed load since the last take */

    kvp_worker_stats stats;
    int stats_dirty;
    kvp_worker_event *ev;
    size_t nev, capev;
};

/* ------------------------------------------------------------ small sets */

void kvp_worker_ids_free(kvp_worker_ids *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++)
        kvp_free(s->ids[i]);
    kvp_free(s->ids);
    memset(s, 0, sizeof *s);
}

int kvp_worker_ids_has(const kvp_worker_ids *s, const char *id)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->ids[i], id) == 0)
            return 1;
    return 0;
}

/* Removes id if present; 1 if it was there. */
static int ids_take(kvp_worker_ids *s, const char *id)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->ids[i], id) == 0) {
            kvp_free(s->ids[i]);
            s->ids[i] = s->ids[--s->n];
            return 1;
        }
    return 0;
}

/* Appends an owned copy of id unless already present. */
static int ids_add(kvp_worker_ids *s, const char *id)
{
    if (kvp_worker_ids_has(s, id))
        return 0;
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 8;
        char **ni = kvp_realloc(s->ids, nc * sizeof *ni);
        if (!ni)
            return KVP_ENOMEM;
        s->ids = ni;
        s->cap = nc;
    }
    char *c = kvp_strdup(id);
    if (!c)
        return KVP_ENOMEM;
    s->ids[s->n++] = c;
    return 0;
}

/* Caller holds w->lock. */
static int lerr_add(kvp_worker *w, uint32_t bid)
{
    for (size_t i = 0; i < w->nlerr; i++)
        if (w->lerr[i] == bid)
            return 0;
    if (w->nlerr == w->caplerr) {
        size_t nc = w->caplerr ? w->caplerr * 2 : 32;
        uint32_t *n = kvp_realloc(w->lerr, nc * sizeof *n);
        if (!n)
            return KVP_ENOMEM;
        w->lerr = n;
        w->caplerr = nc;
    }
    w->lerr[w->nlerr++] = bid;
    return 0;
}

/* Records n blocks of request id whose load failed: the blocks for
 * load_errors, the id for load_failed (engines whose block ids are not
 * unique across groups report whole requests). */
static void mark_invalid(kvp_worker *w, const char *id, const uint32_t *bids, size_t n)
{
    pthread_mutex_lock(&w->lock);
    for (size_t i = 0; i < n; i++)
        if (lerr_add(w, bids[i]) != 0)
            KVP_ERROR(MOD, "out of memory recording load-error block %u", bids[i]);
    if (id && ids_add(&w->lfail, id) != 0)
        KVP_ERROR(MOD, "out of memory recording the failed load of %s", id);
    pthread_mutex_unlock(&w->lock);
}

/* Caller holds w->lock. */
static sreq *sreq_find(kvp_worker *w, const char *id)
{
    for (size_t i = 0; i < w->nreqs; i++)
        if (strcmp(w->reqs[i].id, id) == 0)
            return &w->reqs[i];
    return NULL;
}

static sreq *sreq_get(kvp_worker *w, const char *id)
{
    sreq *e = sreq_find(w, id);
    if (e)
        return e;
    if (w->nreqs == w->capreqs) {
        size_t nc = w->capreqs ? w->capreqs * 2 : 16;
        sreq *n = kvp_realloc(w->reqs, nc * sizeof *n);
        if (!n)
            return NULL;
        w->reqs = n;
        w->capreqs = nc;
    }
    char *c = kvp_strdup(id);
    if (!c)
        return NULL;
    e = &w->reqs[w->nreqs++];
    memset(e, 0, sizeof *e);
    e->id = c;
    return e;
}

static void sreq_del(kvp_worker *w, sreq *e)
{
    kvp_free(e->id);
    *e = w->reqs[--w->nreqs];
}

/* ------------------------------------------------------------ stats */

static void stat_rec(kvp_worker *w, int op, uint64_t t0, size_t keys, uint64_t bytes,
                     size_t failed, size_t existing, int error)
{
    uint64_t dt = kvp_now_ns() - t0;
    pthread_mutex_lock(&w->lock);
    kvp_worker_op_stats *s = &w->stats.op[op];
    s->count++;
    s->total_ns += dt;
    if (dt > s->max_ns)
        s->max_ns = dt;
    s->keys += keys;
    s->bytes += bytes;
    s->failed_keys += failed;
    s->existing_keys += existing;
    if (error)
        s->errors++;
    else if (failed)
        s->partial++;
    w->stats_dirty = 1;
    pthread_mutex_unlock(&w->lock);
}

int kvp_worker_take_stats(kvp_worker *w, kvp_worker_stats *out)
{
    pthread_mutex_lock(&w->lock);
    *out = w->stats;
    int dirty = w->stats_dirty;
    memset(&w->stats, 0, sizeof w->stats);
    w->stats_dirty = 0;
    pthread_mutex_unlock(&w->lock);
    return dirty;
}

void kvp_worker_pool_status(kvp_worker *w, kvp_plink_status *out)
{
    kvp_plink_status_get(w->link, out);
}

void kvp_worker_events_free(kvp_worker_event *ev, size_t n)
{
    if (!ev)
        return;
    for (size_t i = 0; i < n; i++)
        kvp_free(ev[i].token_ids);
    kvp_free(ev);
}

int kvp_worker_take_events(kvp_worker *w, kvp_worker_event **ev, size_t *n)
{
    pthread_mutex_lock(&w->lock);
    *ev = w->ev;
    *n = w->nev;
    w->ev = NULL;
    w->nev = w->capev = 0;
    pthread_mutex_unlock(&w->lock);
    return 0;
}

/* ------------------------------------------------------------ transfer batches */

/* Keys + scatter/gather lists of one put or get. */
typedef struct xb {
    size_t n, cap, nsegs;
    size_t keystride;
    char *keybuf;
    char **keys;
    kvp_iov *iov;       /* cap * nsegs */
    kvp_iov **iovp;     /* per key: iov + k*nsegs */
    size_t *niov;
    uint32_t *bid;
    uint32_t *grp;
    uint64_t *start, *end;
    const uint8_t **hash;
    kvp_block *blk;     /* per key: its block (pool_blocks), else NULL */
    int64_t *res;
    uint32_t *part;     /* per key: its head among the chunk's (xb_heads), else NULL */
} xb;

static void xb_free(xb *b)
{
    kvp_free(b->keybuf);
    kvp_free(b->keys);
    kvp_free(b->iov);
    kvp_free(b->iovp);
    kvp_free(b->niov);
    kvp_free(b->bid);
    kvp_free(b->grp);
    kvp_free(b->start);
    kvp_free(b->end);
    kvp_free(b->hash);
    kvp_free(b->blk);
    kvp_free(b->res);
    kvp_free(b->part);
    memset(b, 0, sizeof *b);
}

/* Room for cap keys of `per` pieces each (0: one per segment). */
static int xb_init2(kvp_worker *w, xb *b, size_t cap, size_t hash_len, size_t per)
{
    memset(b, 0, sizeof *b);
    size_t maxp = 0;
    for (size_t g = 0; g < w->ng; g++) {
        if (w->prefix_len[g] > maxp)
            maxp = w->prefix_len[g];
        for (uint32_t j = 0; w->by_head && j < w->nloc; j++) {
            size_t l = strlen(w->hprefix[g] + w->hprefix_off[g][j]);
            maxp = l > maxp ? l : maxp;
        }
    }
    b->cap = cap ? cap : 1;
    b->nsegs = per ? per : w->layout.nsegs;
    b->keystride = maxp + 2 + 2 * hash_len;
    b->keybuf = kvp_malloc(b->cap * b->keystride);
    b->keys = kvp_calloc(b->cap, sizeof *b->keys);
    b->iov = kvp_calloc(b->cap * b->nsegs, sizeof *b->iov);
    b->iovp = kvp_calloc(b->cap, sizeof *b->iovp);
    b->niov = kvp_calloc(b->cap, sizeof *b->niov);
    b->bid = kvp_calloc(b->cap, sizeof *b->bid);
    b->grp = kvp_calloc(b->cap, sizeof *b->grp);
    b->start = kvp_calloc(b->cap, sizeof *b->start);
    b->end = kvp_calloc(b->cap, sizeof *b->end);
    b->hash = kvp_calloc(b->cap, sizeof *b->hash);
    b->res = kvp_calloc(b->cap, sizeof *b->res);
    b->blk = w->block_group ? kvp_calloc(b->cap, sizeof *b->blk) : NULL;
    if (!b->keybuf || !b->keys || !b->iov || !b->iovp || !b->niov || !b->bid || !b->grp ||
        !b->start || !b->end || !b->hash || !b->res || (w->block_group && !b->blk)) {
        xb_free(b);
        return KVP_ENOMEM;
    }
    for (size_t k = 0; k < b->cap; k++) {
        b->keys[k] = b->keybuf + k * b->keystride;
        b->iovp[k] = b->iov + k * b->nsegs;
        b->niov[k] = b->nsegs;
    }
    return 0;
}

static int xb_init(kvp_worker *w, xb *b, size_t cap, size_t hash_len)
{
    return xb_init2(w, b, cap, hash_len, 0);
}

/*
 * The TP-independent layout (w->by_head): replaces b, whose keys are one
 * whole block each (one piece per segment), by one key per block and head
 * of this rank -- prefix of head j + "@" + hex(hash), the head's pieces
 * (kvp_tdb_head_slice), the block's id, group, range and hash copied,
 * part = j. Nothing to do without by_head. 0, or KVP_ENOMEM /
 * KVP_EINVALID_PARAMS (b is then unchanged).
 */
static int xb_heads(kvp_worker *w, xb *b, size_t hash_len)
{
    if (!w->by_head || b->n == 0)
        return 0;
    xb o;
    int rc = xb_init2(w, &o, b->n * w->nloc, hash_len, kvp_tdb_head_npieces(&w->layout));
    if (rc == 0 && !(o.part = kvp_calloc(o.cap, sizeof *o.part)))
        rc = KVP_ENOMEM;
    for (size_t k = 0; rc == 0 && k < b->n; k++)
        for (uint32_t j = 0; rc == 0 && j < w->nloc; j++) {
            size_t q = o.n++, len;
            uint32_t g = b->grp[k];
            const char *pre = w->hprefix[g] + w->hprefix_off[g][j];
            rc = kvp_tdb_head_slice(&w->layout, b->iovp[k], j, o.iovp[q], o.nsegs);
            if (rc == 0)
                rc = kvp_key_build_key_string(pre, strlen(pre), b->hash[k], hash_len, o.keys[q],
                                              o.keystride, &len);
            o.bid[q] = b->bid[k];
            o.grp[q] = g;
            o.start[q] = b->start[k];
            o.end[q] = b->end[k];
            o.hash[q] = b->hash[k];
            o.part[q] = j;
        }
    if (rc != 0) {
        xb_free(&o);
        return rc;
    }
    xb_free(b);
    *b = o;
    return 0;
}

/* Writes key k = prefix(g) + "@" + hex(hash). */
static int xb_key(kvp_worker *w, xb *b, size_t k, uint32_t g, const uint8_t *hash, size_t hl)
{
    size_t len;
    b->grp[k] = g;
    b->hash[k] = hash;
    return kvp_key_build_key_string(w->prefix[g], w->prefix_len[g], hash, hl, b->keys[k],
                                    b->keystride, &len);
}

/* Mask arrays for every group over `tokens` tokens; *bits to kvp_free. */
static int masks_alloc(kvp_worker *w, size_t tokens, struct kvp_coord_mask *m, uint8_t **bits)
{
    size_t total = 0;
    for (size_t g = 0; g < w->ng; g++)
        total += kvp_coord_mask_cap(w->coord, g, tokens);
    *bits = kvp_calloc(total ? total : 1, 1);
    if (!*bits)
        return KVP_ENOMEM;
    size_t off = 0;
    for (size_t g = 0; g < w->ng; g++) {
        memset(&m[g], 0, sizeof m[g]);
        m[g].cap = kvp_coord_mask_cap(w->coord, g, tokens);
        m[g].bits = *bits + off;
        off += m[g].cap;
    }
    return 0;
}

static size_t chunks_upper(kvp_worker *w, uint64_t tokens)
{
    size_t n = 0;
    for (size_t g = 0; g < w->ng; g++)
        n += (size_t)((tokens + w->B[g] - 1) / w->B[g]) + 1;
    return n;
}

/* Fences engine memory for the writes of job j's step; 0 or
 * KVP_EINTERNAL_ERROR. */
static int fence(kvp_worker *w, const job *j)
{
    if (!w->fence)
        return 0;
    return w->fence(w->fence_arg, j->step) == 0 ? 0 : KVP_EINTERNAL_ERROR;
}

static void clear_pressure(kvp_worker *w)
{
    pthread_mutex_lock(&w->lock);
    int was = w->pressure;
    w->pressure = 0;
    for (size_t i = 0; i < w->nreqs; i++) {
        was |= w->reqs[i].skip;
        w->reqs[i].skip = 0;
    }
    pthread_mutex_unlock(&w->lock);
    if (was)
        KVP_INFO(MOD, "store pressure cleared: a put batch fully succeeded");
}

static void mark_pressure(kvp_worker *w, const job *j)
{
    pthread_mutex_lock(&w->lock);
    sreq *e = sreq_find(w, j->req_id);
    int newly = e && !e->skip;
    w->pressure = 1;
    if (e)
        e->skip = 1;
    pthread_mutex_unlock(&w->lock);
    if (newly)
        KVP_WARN(MOD, "store pressure (NO_AVAILABLE_HANDLE): backing off request %s", j->req_id);
}

static void record_saved(kvp_worker *w, const job *j, uint64_t T)
{
    pthread_mutex_lock(&w->lock);
    sreq *e = sreq_find(w, j->req_id);
    if (e && e->gen == j->gen && T > e->saved)
        e->saved = T;
    pthread_mutex_unlock(&w->lock);
}

static int is_mamba(const kvp_worker *w, uint32_t g);

/* vLLM's int form of a block hash: its last 8 bytes, big-endian. */
static uint64_t engine_hash(const uint8_t *h, size_t len)
{
    uint64_t v = 0;
    for (size_t i = len > 8 ? len - 8 : 0; i < len; i++)
        v = v << 8 | h[i];
    return v;
}

/* The block key k of b is a part of: its hash, its parent (the group's
 * previous block: block_size / H hashes back, when that is in the request),
 * its size and how many objects make it (every rank namespace's). */
static void fill_block(const kvp_worker *w, const job *j, const xb *b, size_t k, kvp_block *o)
{
    uint32_t g = b->grp[k];
    memset(o, 0, sizeof *o);
    if (w->block_group[g] < 0) {
        o->flags = KVP_BLOCK_NONE;
        return;
    }
    o->hash = engine_hash(b->hash[k], j->hash_len);
    o->block_size = w->B[g];
    o->parts = (uint16_t)w->lk_n[g];
    o->group = (uint8_t)w->block_group[g];
    size_t back = (size_t)(w->B[g] / w->H) * j->hash_len;
    if (!is_mamba(w, g) && w->B[g] % w->H == 0 && back &&
        (size_t)(b->hash[k] - j->hashes) >= back) {
        o->parent = engine_hash(b->hash[k] - back, j->hash_len);
        o->flags = KVP_BLOCK_PARENT;
    }
}

/*
 * Fence, one dedup-put, stats, events, pressure. Returns 0 when every key
 * succeeded (stored or already there), 1 when some failed, < 0 when the
 * put could not be issued.
 */
static int put_batch(kvp_worker *w, const job *j, xb *b)
{
    uint64_t t0 = kvp_now_ns();
    kvp_client *cl = kvp_plink_client(w->link);
    int rc = cl ? fence(w, j) : KVP_ERPC_FAIL; /* none: the pool went down meanwhile */
    kvp_put_opts po;
    kvp_put_opts_init(&po);
    if (b->blk) {
        for (size_t k = 0; k < b->n; k++)
            fill_block(w, j, b, k, &b->blk[k]);
        po.blocks = b->blk;
    }
    if (rc == 0)
        rc = kvp_client_batch_put_opts(cl, (const char *const *)b->keys,
                                       (const kvp_iov *const *)b->iovp, b->niov, b->n,
                                       b->blk ? &po : NULL, b->res);
    if (rc < 0) {
        stat_rec(w, KVP_WORKER_OP_SAVE_PUT, t0, b->n, 0, b->n, 0, 1);
        if (cl && !kvp_plink_check(w->link, rc, NULL, NULL, 0)) /* an outage: logged once */
            KVP_WARN(MOD, "put of %zu keys for %s not issued: %s", b->n, j->req_id,
                     kvp_err_name(rc));
        return rc;
    }
    uint64_t bytes = 0;
    size_t failed = 0, existing = 0;
    int pressure = 0;
    for (size_t k = 0; k < b->n; k++) {
        if (b->res[k] > 0)
            bytes += (uint64_t)b->res[k];
        else if (b->res[k] == 0)
            existing++;
        else {
            failed++;
            pressure |= b->res[k] == KVP_ENO_AVAILABLE_HANDLE;
        }
    }
    stat_rec(w, KVP_WORKER_OP_SAVE_PUT, t0, b->n, bytes, failed, existing, 0);
    if (w->enable_kv_events) {
        const uint8_t *last[KVP_COORD_MAX_GROUPS] = {0};
        pthread_mutex_lock(&w->lock);
        for (size_t k = 0; k < b->n; k++) {
            if (b->res[k] <= 0)
                continue;
            /* by_head: one event per block, at the first of its heads that moved bytes */
            size_t first = b->part ? k - b->part[k] : k, moved = 0;
            for (size_t q = first; q < k; q++)
                moved |= b->res[q] > 0;
            if (moved)
                continue;
            if (w->nev == w->capev) {
                size_t nc = w->capev ? w->capev * 2 : 64;
                kvp_worker_event *ne = kvp_realloc(w->ev, nc * sizeof *ne);
                if (!ne)
                    break;
                w->ev = ne;
                w->capev = nc;
            }
            kvp_worker_event *e = &w->ev[w->nev++];
            memset(e, 0, sizeof *e);
            uint32_t g = b->grp[k];
            e->group = g;
            e->block_size = w->B[g];
            e->hash_len = j->hash_len;
            memcpy(e->hash, b->hash[k], j->hash_len);
            if (last[g]) {
                e->has_parent = 1;
                memcpy(e->parent, last[g], j->hash_len);
            }
            last[g] = b->hash[k];
            e->start = b->start[k];
            e->end = b->end[k];
            if (j->token_ids && b->end[k] <= j->n_token_ids && b->end[k] > b->start[k]) {
                e->n_token_ids = (uint32_t)(b->end[k] - b->start[k]);
                e->token_ids = dup_mem(j->token_ids + b->start[k],
                                       e->n_token_ids * sizeof(uint32_t));
                if (!e->token_ids)
                    e->n_token_ids = 0;
            }
        }
        pthread_mutex_unlock(&w->lock);
    }
    if (failed) {
        if (!kvp_plink_check(w->link, 0, b->res, NULL, b->n)) /* an outage: logged once */
            KVP_WARN(MOD, "put for %s: %zu of %zu keys failed", j->req_id, failed, b->n);
        if (pressure)
            mark_pressure(w, j);
        return 1;
    }
    clear_pressure(w);
    return 0;
}

static int is_mamba(const kvp_worker *w, uint32_t g)
{
    return kvp_coord_group_spec(w->coord, g)->kind == KVP_COORD_MAMBA;
}

/* Appends block bid of group g under the key of the prefix ending at `end`
 * tokens (hashes[end / H - 1]); 0, or -1 when the block is outside the
 * registered cache or the key cannot be built. */
static int bput_add(kvp_worker *w, const job *j, xb *b, uint32_t g, uint32_t bid, uint64_t start,
                    uint64_t end)
{
    size_t k = b->n;
    if (k >= b->cap)
        return -1;
    if (kvp_tdb_prepare_block(&w->tdb[g], bid, b->iovp[k], b->nsegs) != 0 ||
        xb_key(w, b, k, g, j->hashes + (end / w->H - 1) * j->hash_len, j->hash_len) != 0) {
        KVP_ERROR(MOD, "boundary put of %s: block %u out of the registered cache", j->req_id,
                  bid);
        return -1;
    }
    b->bid[k] = bid;
    b->start[k] = start;
    b->end[k] = end;
    b->n++;
    return 0;
}

/* vLLM's get_mamba_prefill_checkpoint_position: the prompt's reusable
 * Mamba boundary (a token left for the logits, an EAGLE block dropped). */
static uint64_t mamba_checkpoint(uint64_t prompt, uint64_t H, int eagle)
{
    uint64_t limit = eagle ? prompt : (prompt ? prompt - 1 : 0);
    uint64_t pos = limit / H * H;
    if (eagle)
        pos = pos >= H ? pos - H : 0;
    return pos;
}

/*
 * The boundary puts of job j (vLLM 0.33's _boundary_puts and
 * _partial_tail_non_mamba_puts), stored before the normal save:
 *   - every hand-off (Mamba group g, block, boundary) puts that exact block
 *     under (g, hashes[boundary / H - 1]) -- never a block found by position:
 *     an align-mode Mamba table is rewritten in place by the engine;
 *   - a sub-block hand-off (boundary % B_g != 0, partial hash hits) at or
 *     before the prefill's Mamba checkpoint also puts every other group's blocks from the
 *     last L-aligned boundary up to it, each keyed by the hash at its end,
 *     clipped to the boundary (the attention KV a hit there needs).
 * Keys are spread over the TP ranks by the normal save's rule (factor 1 for
 * Mamba: every rank puts its own state). Returns 1 to go on with the normal
 * save, 0 to abort the job (a put failed: retried by a later step).
 */
static int boundary_puts(kvp_worker *w, const job *j)
{
    if (!j->nhashes || !j->ntails)
        return 1;
    uint64_t sub = 0; /* a sub-block Mamba boundary, 0 = none */
    for (uint32_t i = 0; i < j->ntails; i++) {
        uint32_t g = j->tails[i].group_id;
        uint64_t bd = j->tails[i].boundary_tokens;
        if (g < w->ng && is_mamba(w, g) && bd % w->B[g] != 0 && bd % w->H == 0)
            sub = bd;
    }
    /* The core hands a sub-block state off at the checkpoint of the
     * request's ORIGINAL prompt (or at a shared-prefix junction before it);
     * num_prompt_tokens is the prefill end, longer for a resumed request.
     * Any sub-block state up to the prefill's checkpoint gets its attention
     * KV: for a junction those are blocks the normal saves already stored
     * (their puts answer "exists"), for a resume's checkpoint they are what
     * a hit there needs. */
    if (sub && j->num_prompt_tokens >= 0 &&
        sub > mamba_checkpoint((uint64_t)j->num_prompt_tokens, w->H, w->use_eagle))
        sub = 0;
    xb b;
    if (xb_init(w, &b, j->ntails + (sub ? chunks_upper(w, w->L) : 0), j->hash_len) != 0)
        return 0;
    int ok = 1;
    for (uint32_t i = 0; i < j->ntails && ok; i++) {
        uint32_t g = j->tails[i].group_id, bid = j->tails[i].cow_block_id;
        uint64_t bd = j->tails[i].boundary_tokens;
        if (g >= w->ng || !is_mamba(w, g) || bd == 0 || bid == 0 || bd / w->H > j->nhashes)
            continue;
        if (bd % w->H != 0) {
            KVP_WARN(MOD, "boundary put of %s at %llu tokens: not a multiple of the hash block "
                          "size %u, skipped", j->req_id, (unsigned long long)bd, w->H);
            continue;
        }
        int step = w->factor[g];
        if ((int)(((bd + w->B[g] - 1) / w->B[g] - 1) % (uint64_t)step) != (w->tp_rank + (int)g) % step)
            continue;
        ok = bput_add(w, j, &b, g, bid, (bd - 1) / w->B[g] * w->B[g], bd) == 0;
    }
    uint64_t start = sub / w->L * w->L;
    for (uint32_t g = 0; sub && ok && g < w->ng && g < j->ngroups; g++) {
        if (is_mamba(w, g))
            continue;
        uint64_t B = w->B[g];
        int step = w->factor[g];
        for (uint64_t c = start / B; c < (sub + B - 1) / B && c < j->nbids[g] && ok; c++) {
            uint32_t bid = j->bids[g][c];
            uint64_t end = (c + 1) * B < sub ? (c + 1) * B : sub;
            if (bid == 0 || (int)(c % (uint64_t)step) != (w->tp_rank + (int)g) % step)
                continue;
            ok = bput_add(w, j, &b, g, bid, c * B, end) == 0;
        }
    }
    if (ok && b.n)
        ok = put_batch(w, j, &b) == 0;
    xb_free(&b);
    return ok;
}

/* Every CFG_REPUT_MS the descriptor is put again (a copy there is kept): its
 * soft pin ends after the master's soft_pin_ttl (30 min by default) and a
 * master restarted between two calls (the client reconnects within one call,
 * so the link never left UP) has lost it. */
#define CFG_REPUT_MS (10u * 60 * 1000)

/* The configuration descriptor (kvpool stat's description of the
 * configurations a pool holds), put by the worker of rank 0 of a storing
 * role, soft-pinned, with the client c of the caller, at the first store job
 * of each link epoch (kvp_plink_epoch: at open, at an attach after a
 * DETACHED start, after an outage) and then every CFG_REPUT_MS. A copy
 * already there (this engine's, or one of the same configuration) is kept.
 * Failures are logged; the next epoch or period tries again. */
static void put_config_object(kvp_worker *w, kvp_client *c)
{
    uint64_t ep = kvp_plink_epoch(w->link), now = kvp_now_ms();
    uint64_t next = __atomic_load_n(&w->cfg_next_ms, __ATOMIC_ACQUIRE);
    if (!w->cfg_key ||
        (ep == __atomic_load_n(&w->cfg_epoch, __ATOMIC_ACQUIRE) && now < next) ||
        !__atomic_compare_exchange_n(&w->cfg_next_ms, &next, now + CFG_REPUT_MS, 0,
                                     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return; /* current, or another thread is putting it */
    __atomic_store_n(&w->cfg_epoch, ep, __ATOMIC_RELEASE);
    kvp_iov iov = {w->cfg_desc, strlen(w->cfg_desc)};
    const kvp_iov *iovp = &iov;
    size_t niov = 1;
    const char *keys[1] = {w->cfg_key};
    int64_t res = 0;
    kvp_put_opts po;
    kvp_put_opts_init(&po);
    po.flags = KVP_PUT_SOFT_PIN;
    int rc = kvp_client_batch_put_opts(c, keys, &iovp, &niov, 1, &po, &res);
    if (rc == 0 && res < 0 && res != KVP_EOBJECT_ALREADY_EXISTS)
        rc = (int)res;
    if (rc < 0)
        KVP_WARN(MOD, "configuration descriptor %s not stored: %s", w->cfg_key, kvp_err_name(rc));
    else
        KVP_DEBUG(MOD, "configuration descriptor %s stored", w->cfg_key);
}

/* §10.3: one save job (001 version, dedup through the put's answer). */
static void send_job(kvp_worker *w, job *j)
{
    uint64_t T = j->token_len_chunk / w->L * w->L;
    pthread_mutex_lock(&w->lock);
    sreq *e = sreq_find(w, j->req_id);
    int run = e && e->gen == j->gen && !(w->pressure && e->skip);
    uint64_t save_start = e ? e->saved : 0;
    pthread_mutex_unlock(&w->lock);
    if (!run)
        return;
    kvp_client *cl = kvp_plink_client(w->link);
    if (!cl) { /* the pool is unavailable: a later job, from e->saved, stores it */
        kvp_plink_skipped(w->link, KVP_PLINK_SKIP_STORE);
        return;
    }
    put_config_object(w, cl); /* once per link epoch */
    if (j->tails && !boundary_puts(w, j))
        return;
    if (T == 0)
        return;
    struct kvp_coord_mask m[KVP_COORD_MAX_GROUPS];
    uint8_t *bits = NULL;
    xb b = {0};
    kvp_tdb_chunk *ch = NULL;
    if (masks_alloc(w, T, m, &bits) != 0)
        goto out;
    int rc = kvp_coord_store_mask(w->coord, T, save_start, j->num_prompt_tokens,
                                  !w->eagle_prefix_hashing, m);
    if (rc != 0) {
        KVP_ERROR(MOD, "store mask for %s: %s", j->req_id, kvp_err_name(rc));
        goto out;
    }
    size_t cap = chunks_upper(w, T);
    ch = kvp_calloc(cap, sizeof *ch);
    if (!ch || xb_init(w, &b, cap, j->hash_len) != 0)
        goto out;
    for (uint32_t g = 0; g < w->ng && g < j->ngroups; g++) {
        int step = w->factor[g];
        size_t nc = 0;
        rc = kvp_tdb_process_tokens(&w->tdb[g], T, j->nhashes, save_start,
                                    m[g].all ? NULL : m[g].bits, m[g].all ? 0 : m[g].len,
                                    (uint32_t)step, (uint32_t)((w->tp_rank + (int)g) % step),
                                    ch, b.cap - b.n, &nc);
        /* NULL_BLOCK_ID (0) holds no KV of this request (a sliding-window
         * block outside the window after a hit, a Mamba interior block):
         * never stored -- its bytes are not this key's (§16 item 14). */
        size_t kept = 0;
        for (size_t i = 0; rc == 0 && i < nc; i++)
            if (ch[i].index >= j->nbids[g] || j->bids[g][ch[i].index] != 0)
                ch[kept++] = ch[i];
        nc = kept;
        if (rc == 0 && nc)
            rc = kvp_tdb_prepare_values(&w->tdb[g], ch, nc, j->bids[g], j->nbids[g],
                                        b.iov + b.n * b.nsegs, (b.cap - b.n) * b.nsegs,
                                        b.bid + b.n);
        for (size_t i = 0; rc == 0 && i < nc; i++) {
            size_t k = b.n + i;
            b.start[k] = ch[i].start;
            b.end[k] = ch[i].end;
            rc = xb_key(w, &b, k, g, j->hashes + ch[i].hash_idx * j->hash_len, j->hash_len);
        }
        if (rc != 0) {
            KVP_ERROR(MOD, "save of %s, group %u: %s", j->req_id, g, kvp_err_name(rc));
            goto out;
        }
        b.n += nc;
    }
    if ((rc = xb_heads(w, &b, j->hash_len)) != 0) {
        KVP_ERROR(MOD, "save of %s: %s", j->req_id, kvp_err_name(rc));
        goto out;
    }
    if (b.n == 0 || put_batch(w, j, &b) == 0)
        record_saved(w, j, T);
out:
    kvp_free(ch);
    kvp_free(bits);
    xb_free(&b);
}

static void *send_main(void *arg)
{
    kvp_worker *w = arg;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (!w->sq_head && !w->stop)
            pthread_cond_wait(&w->send_cv, &w->lock);
        if (!w->sq_head)
            break;
        job *j = w->sq_head;
        w->sq_head = j->next;
        if (!w->sq_head)
            w->sq_tail = NULL;
        w->send_cur = j;
        pthread_mutex_unlock(&w->lock);
        send_job(w, j);
        pthread_mutex_lock(&w->lock);
        w->send_cur = NULL;
        sreq *e = sreq_find(w, j->req_id); /* finally: always release the pin */
        /* a send job exists only while its entry counts it in inflight */
        if (KVP_ALWAYS(e && e->inflight))
            e->inflight--;
        KVP_ASSERT(w->send_busy > 0);
        w->send_busy--;
        pthread_cond_broadcast(&w->idle_cv);
        pthread_mutex_unlock(&w->lock);
        job_free(j);
        pthread_mutex_lock(&w->lock);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

/* ------------------------------------------------------------ loads §10.6 */

static uint64_t staging(const kvp_iov *iov, size_t n)
{
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++)
        s += iov[i].len;
    return (s + STAGING_ALIGN - 1) / STAGING_ALIGN * STAGING_ALIGN + STAGING_PAD;
}

/* 1 if the engine finished request id while its load was pending. */
static int load_aborted(kvp_worker *w, const char *id)
{
    pthread_mutex_lock(&w->lock);
    int r = kvp_worker_ids_has(&w->aborted, id);
    pthread_mutex_unlock(&w->lock);
    return r;
}

/* VLLM_MOONCAKE_STORE_TIER_LOG: where one load batch's keys were (as
 * looked up just before the get) and how the get went, per tier. */
static void tier_summary(const char *req_id, const int *tiers, const int64_t *res, size_t n)
{
    size_t dram = 0, disk = 0, gone = 0, ok[3] = {0}, err[3] = {0};
    for (size_t i = 0; i < n; i++) {
        int t = tiers[i] < 0 ? 2 : (tiers[i] & KVP_TIER_DRAM) ? 0 : (tiers[i] & KVP_TIER_DISK) ? 1 : 2;
        dram += t == 0, disk += t == 1, gone += t == 2;
        if (res[i] >= 0)
            ok[t]++;
        else
            err[t]++;
    }
    KVP_INFO(MOD, "load of %s: %zu keys: %zu in DRAM (%zu ok, %zu failed), %zu on disk only "
                  "(%zu ok, %zu failed), %zu missing (%zu ok, %zu failed)",
             req_id, n, dram, ok[0], err[0], disk, ok[1], err[1], gone, ok[2], err[2]);
}

static int recv_job(kvp_worker *w, job *j)
{
    uint64_t T = j->ls.kvpool_cached_tokens;
    uint64_t mask_num = j->ls.vllm_cached_tokens / w->L * w->L;
    struct kvp_coord_mask m[KVP_COORD_MAX_GROUPS];
    uint8_t *bits = NULL;
    kvp_tdb_chunk *ch = NULL;
    size_t *bstart = NULL;
    uint32_t *obid = NULL;
    xb b = {0};
    /* no client: the pool is unavailable, the load fails at once (below) */
    kvp_client *cl = kvp_plink_client(w->link);
    int rc = cl ? masks_alloc(w, T, m, &bits) : KVP_ERPC_FAIL;
    if (rc == 0) {
        struct kvp_coord_hashes h = {j->hashes, j->nhashes, j->hash_len, 0};
        rc = kvp_coord_load_mask(w->coord, &h, T, m, NULL);
    }
    size_t cap = chunks_upper(w, T);
    if (rc == 0) {
        ch = kvp_calloc(cap, sizeof *ch);
        rc = ch ? xb_init(w, &b, cap, j->hash_len) : KVP_ENOMEM;
    }
    for (uint32_t g = 0; rc == 0 && g < w->ng && g < j->ngroups; g++) {
        size_t nc = 0, kept = 0;
        rc = kvp_tdb_process_tokens(&w->tdb[g], T, j->nhashes, mask_num, NULL, 0, 1, 0, ch,
                                    cap, &nc);
        for (size_t i = 0; rc == 0 && i < nc; i++) {
            uint64_t c = ch[i].index;
            if (m[g].all || (c < m[g].len && m[g].bits[c]))
                ch[kept++] = ch[i];
        }
        if (rc == 0 && kept)
            rc = kvp_tdb_prepare_values(&w->tdb[g], ch, kept, j->bids[g], j->nbids[g],
                                        b.iov + b.n * b.nsegs, (b.cap - b.n) * b.nsegs,
                                        b.bid + b.n);
        for (size_t i = 0; rc == 0 && i < kept; i++)
            rc = xb_key(w, &b, b.n + i, g, j->hashes + ch[i].hash_idx * j->hash_len,
                        j->hash_len);
        if (rc == 0)
            b.n += kept;
    }
    if (rc == 0)
        rc = xb_heads(w, &b, j->hash_len);
    if (rc != 0) {
        /* Nothing was transferred: every block the load would have written
         * from the local prefix on is unusable. */
        if (cl)
            KVP_ERROR(MOD, "load of %s not built: %s", j->req_id, kvp_err_name(rc));
        else
            kvp_plink_skipped(w->link, KVP_PLINK_FAIL_LOAD);
        for (uint32_t g = 0; g < j->ngroups && g < w->ng; g++) {
            uint64_t c0 = (mask_num + w->B[g] - 1) / w->B[g], c1 = (T + w->B[g] - 1) / w->B[g];
            for (uint64_t c = c0; c < c1 && c < j->nbids[g]; c++)
                mark_invalid(w, j->req_id, &j->bids[g][c], 1);
        }
        goto finish;
    }
    if (b.n == 0)
        goto finish; /* defect fix: a zero-key load finishes */
    /* Rotation by TP rank (load balancing), then staging-budget split. */
    bstart = kvp_calloc(b.n + 1, sizeof *bstart);
    obid = kvp_calloc(b.n, sizeof *obid);
    char **okeys = kvp_calloc(b.n, sizeof *okeys);
    kvp_iov **oiov = kvp_calloc(b.n, sizeof *oiov);
    size_t *oniov = kvp_calloc(b.n, sizeof *oniov);
    int64_t *ores = b.res;
    if (!bstart || !obid || !okeys || !oiov || !oniov) {
        kvp_free(okeys);
        kvp_free(oiov);
        kvp_free(oniov);
        mark_invalid(w, j->req_id, b.bid, b.n);
        goto finish;
    }
    size_t rot = (size_t)w->tp_rank % b.n;
    for (size_t i = 0; i < b.n; i++) {
        size_t s = (i + rot) % b.n;
        okeys[i] = b.keys[s];
        oiov[i] = b.iovp[s];
        oniov[i] = b.niov[s];
        obid[i] = b.bid[s];
    }
    size_t nb = 0;
    bstart[0] = 0;
    /* the seeds' rule: with an SSD tier and no budget given, 1280 MiB */
    uint64_t raw = w->staging_budget ? w->staging_budget
                   : kvp_client_offload(cl) ? KVP_WORKER_DISK_STAGING_DEFAULT : 0;
    uint64_t total = 0;
    for (size_t i = 0; raw && i < b.n; i++)
        total += staging(oiov[i], oniov[i]);
    uint64_t usable = (uint64_t)((double)raw * w->staging_ratio);
    if (usable < 1)
        usable = 1;
    if (raw && total > usable) {
        uint64_t cur = 0;
        size_t curn = 0;
        for (size_t i = 0; i < b.n; i++) {
            uint64_t kb = staging(oiov[i], oniov[i]);
            if (kb > raw) {
                KVP_WARN(MOD, "skipping load of %s: key %s needs %llu staging bytes, budget %llu",
                         j->req_id, okeys[i], (unsigned long long)kb, (unsigned long long)raw);
                mark_invalid(w, j->req_id, obid, b.n);
                nb = 0;
                goto free_rot;
            }
            if (curn && (kb > usable || cur + kb > usable)) {
                bstart[++nb] = i;
                cur = 0;
                curn = 0;
            }
            cur += kb;
            curn++;
            if (kb > usable) { /* alone in its batch */
                bstart[++nb] = i + 1;
                cur = 0;
                curn = 0;
            }
        }
        if (curn)
            bstart[++nb] = b.n;
    } else {
        bstart[++nb] = b.n;
    }
    for (size_t bi = 0; bi < nb; bi++) {
        size_t s = bstart[bi], n = bstart[bi + 1] - s;
        if (bi > 0 && load_aborted(w, j->req_id)) /* the engine finished it: its */
            break;                                 /* blocks are not needed any more */
        if (bi > 0 && !(cl = kvp_plink_client(w->link))) { /* the pool went down */
            mark_invalid(w, j->req_id, obid + s, b.n - s); /* this and every later one */
            break;
        }
        int *tiers = w->tier_log ? kvp_calloc(n, sizeof *tiers) : NULL;
        if (tiers && kvp_client_tiers(cl, (const char *const *)okeys + s, n, tiers) != 0) {
            kvp_free(tiers); /* looked up before the get: its time is not the get's */
            tiers = NULL;
        }
        uint64_t t0 = kvp_now_ns();
        rc = kvp_client_batch_get_into_multi_buffers(cl, (const char *const *)okeys + s,
                                                     (const kvp_iov *const *)oiov + s,
                                                     oniov + s, n, ores + s);
        if (rc < 0) {
            stat_rec(w, KVP_WORKER_OP_LOAD_GET, t0, n, 0, n, 0, 1);
            if (!kvp_plink_check(w->link, rc, NULL, NULL, 0)) /* an outage: logged once */
                KVP_WARN(MOD, "load of %s: get of %zu keys failed: %s", j->req_id, n,
                         kvp_err_name(rc));
            mark_invalid(w, j->req_id, obid + s, b.n - s); /* this and every later sub-batch */
            break;
        }
        uint64_t bytes = 0;
        size_t failed = 0;
        for (size_t i = s; i < s + n; i++) {
            if (ores[i] < 0) {
                failed++;
                mark_invalid(w, j->req_id, &obid[i], 1);
            } else {
                bytes += (uint64_t)ores[i];
            }
        }
        stat_rec(w, KVP_WORKER_OP_LOAD_GET, t0, n, bytes, failed, 0, 0);
        if (tiers) {
            tier_summary(j->req_id, tiers, ores + s, n);
            kvp_free(tiers);
        }
        if (failed) {
            if (!kvp_plink_check(w->link, 0, ores + s, NULL, n)) /* an outage: logged once */
                KVP_WARN(MOD, "load of %s: %zu of %zu keys failed", j->req_id, failed, n);
            mark_invalid(w, j->req_id, obid + s + n, b.n - s - n); /* defect fix: never attempted */
            break;
        }
    }
free_rot:
    kvp_free(okeys);
    kvp_free(oiov);
    kvp_free(oniov);
finish:
    pthread_mutex_lock(&w->lock);
    int unreported = ids_add(&w->recv_done, j->req_id) != 0;
    if (unreported)
        KVP_ERROR(MOD, "out of memory reporting %s finished receiving: retried next step",
                  j->req_id);
    pthread_mutex_unlock(&w->lock);
    kvp_free(bstart);
    kvp_free(obid);
    kvp_free(ch);
    kvp_free(bits);
    xb_free(&b);
    return unreported;
}

static void *recv_main(void *arg)
{
    kvp_worker *w = arg;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (!w->rq_head && !w->stop)
            pthread_cond_wait(&w->recv_cv, &w->lock);
        if (!w->rq_head)
            break;
        job *j = w->rq_head;
        w->rq_head = j->next;
        if (!w->rq_head)
            w->rq_tail = NULL;
        j->next = w->rrun;
        w->rrun = j;
        pthread_mutex_unlock(&w->lock);
        int keep = recv_job(w, j);
        pthread_mutex_lock(&w->lock);
        for (job **pp = &w->rrun; *pp; pp = &(*pp)->next)
            if (*pp == j) {
                *pp = j->next;
                break;
            }
        if (keep) { /* report it from a later get_finished */
            j->next = w->unreported;
            w->unreported = j;
        } else {
            job_free(j);
        }
        w->recv_busy--;
        pthread_cond_broadcast(&w->idle_cv);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

/* ------------------------------------------------------------ lifecycle §10.1 */

static void set_err(char *err, size_t errlen, const char *msg)
{
    if (err && errlen)
        snprintf(err, errlen, "%s", msg);
}

/* $VLLM_MOONCAKE_DISK_STAGING_USABLE_RATIO (0, 1], default 0.9, and
 * $VLLM_MOONCAKE_STORE_TIER_LOG (1/true/yes/on). */
static int staging_env(kvp_worker *w, char *err, size_t errlen)
{
    w->staging_ratio = 0.9;
    const char *r = getenv("VLLM_MOONCAKE_DISK_STAGING_USABLE_RATIO");
    if (r && *r) {
        char *end;
        errno = 0;
        double v = strtod(r, &end);
        if (errno || end == r || *end || !(v > 0 && v <= 1)) {
            if (err && errlen)
                snprintf(err, errlen,
                         "VLLM_MOONCAKE_DISK_STAGING_USABLE_RATIO=\"%.40s\" is not a ratio in "
                         "(0, 1]", r);
            return KVP_EINVALID_PARAMS;
        }
        w->staging_ratio = v;
    }
    const char *t = getenv("VLLM_MOONCAKE_STORE_TIER_LOG");
    w->tier_log = t && (!strcmp(t, "1") || !strcasecmp(t, "true") || !strcasecmp(t, "yes") ||
                        !strcasecmp(t, "on"));
    return 0;
}

int kvp_worker_capacity_only(const kvp_worker *w) { return w->capacity_only; }

static int valid_rank(int r, int n) { return n >= 1 && r >= 0 && r < n; }

/* The global KV heads of group g in the TP-independent layout (an MLA
 * latent is one head). */
static int group_heads(const kvp_worker_group *g)
{
    return g->key_spec == KVP_KEY_SPEC_ATTENTION ? g->num_kv_heads : 1;
}

/* by_head: this rank's first global head of group g (nloc heads from it). */
static int head0(const kvp_worker *w, const kvp_worker_cfg *cfg, size_t g)
{
    return cfg->tp_rank / w->factor[g] * (int)w->nloc;
}

/* by_head: the prefixes of this rank's heads of group g (w->hprefix). */
static int build_head_prefixes(kvp_worker *w, const struct kvp_key_meta *md, int h0, size_t g)
{
    size_t total = 0, len = 0;
    w->hprefix_off[g] = kvp_calloc(w->nloc, sizeof(size_t));
    if (!w->hprefix_off[g])
        return KVP_ENOMEM;
    for (uint32_t j = 0; j < w->nloc; j++) {
        kvp_key_build_prefix(md, h0 + (int)j, KVP_KEY_RANK_SELF, KVP_KEY_RANK_SELF,
                             KVP_KEY_RANK_SELF, NULL, 0, &len);
        w->hprefix_off[g][j] = total;
        total += len + 1;
    }
    if (!(w->hprefix[g] = kvp_malloc(total)))
        return KVP_ENOMEM;
    for (uint32_t j = 0; j < w->nloc; j++) {
        size_t off = w->hprefix_off[g][j];
        int rc = kvp_key_build_prefix(md, h0 + (int)j, KVP_KEY_RANK_SELF, KVP_KEY_RANK_SELF,
                                      KVP_KEY_RANK_SELF, w->hprefix[g] + off, total - off, &len);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Own prefix and lookup prefixes of group g. The TP-independent layout
 * looks up every global head of the group (dcp 1): namespaces "tp" =
 * head 0..heads-1, each read by factor ranks. */
static int build_prefixes(kvp_worker *w, const kvp_worker_cfg *cfg, size_t g)
{
    struct kvp_key_meta md;
    int rc = kvp_key_meta_init(&md, cfg->model_path ? cfg->model_path : "", cfg->cache_prefix,
                               w->by_head ? head0(w, cfg, g)
                                          : kvp_key_tp_rank_for_group(cfg->tp_rank, w->factor[g]),
                               cfg->pcp_rank, cfg->dcp_rank, cfg->pp_rank, (int)g);
    if (rc == 0)
        rc = kvp_key_meta_set_fingerprint(&md, cfg->config_fingerprint);
    md.by_head = w->by_head != 0;
    if (rc == 0 && w->by_head)
        rc = build_head_prefixes(w, &md, head0(w, cfg, g), g);
    if (rc != 0)
        return rc;
    /* the namespaces to look up: (tp, dcp, factor) of the rank layout, or
     * (heads, 1, 1) of the head layout */
    int ns_tp = w->by_head ? group_heads(&cfg->groups[g]) : cfg->tp_size;
    int ns_dcp = w->by_head ? 1 : cfg->dcp_size;
    int ns_f = w->by_head ? 1 : w->factor[g];
    size_t len = 0;
    kvp_key_build_prefix(&md, KVP_KEY_RANK_SELF, KVP_KEY_RANK_SELF, KVP_KEY_RANK_SELF,
                         KVP_KEY_RANK_SELF, NULL, 0, &len);
    w->prefix[g] = kvp_malloc(len + 1);
    if (!w->prefix[g])
        return KVP_ENOMEM;
    rc = kvp_key_build_prefix(&md, KVP_KEY_RANK_SELF, KVP_KEY_RANK_SELF, KVP_KEY_RANK_SELF,
                              KVP_KEY_RANK_SELF, w->prefix[g], len + 1, &w->prefix_len[g]);
    if (rc != 0)
        return rc;
    size_t n = 0, used = 0;
    rc = kvp_key_lookup_namespaces(ns_tp, cfg->pcp_size, ns_dcp, cfg->pp_size, ns_f, NULL, 0,
                                   &n);
    if (rc != 0 && rc != KVP_EBUFFER_OVERFLOW)
        return rc;
    struct kvp_key_ns *ns = kvp_calloc(n ? n : 1, sizeof *ns);
    w->lk_off[g] = kvp_calloc(n ? n : 1, sizeof(size_t));
    if (!ns || !w->lk_off[g]) {
        kvp_free(ns);
        return KVP_ENOMEM;
    }
    rc = kvp_key_lookup_prefixes(&md, ns_tp, cfg->pcp_size, ns_dcp, cfg->pp_size, ns_f, ns, n,
                                 NULL, 0, w->lk_off[g], n, &w->lk_n[g], &used);
    if (rc == KVP_EBUFFER_OVERFLOW) {
        w->lk_buf[g] = kvp_malloc(used ? used : 1);
        rc = w->lk_buf[g] ? kvp_key_lookup_prefixes(&md, ns_tp, cfg->pcp_size, ns_dcp,
                                                    cfg->pp_size, ns_f, ns, n, w->lk_buf[g], used,
                                                    w->lk_off[g], n, &w->lk_n[g], &used)
                          : KVP_ENOMEM;
    }
    kvp_free(ns);
    return rc;
}

/* The configuration's descriptor object (kvp_worker_cfg.config_description):
 * put once, soft-pinned for the master's soft_pin_ttl; one that exists (an
 * engine of the same configuration put it) is kept. Failures are logged. */
static int config_object_init(kvp_worker *w, const kvp_worker_cfg *cfg)
{
    struct kvp_key_meta md;
    char key[2 * KVP_KEY_NAME_MAX + KVP_KEY_FP_MAX + 32];
    size_t len = 0;
    if (kvp_key_meta_init(&md, cfg->model_path ? cfg->model_path : "", cfg->cache_prefix, 0, 0,
                          0, 0, 0) != 0 ||
        kvp_key_meta_set_fingerprint(&md, cfg->config_fingerprint) != 0 ||
        kvp_key_build_config_key(&md, key, sizeof key, &len) != 0)
        return KVP_EINVALID_PARAMS; /* validated by create: not reached */
    w->cfg_key = kvp_strdup(key);
    w->cfg_desc = kvp_strdup(cfg->config_description);
    return w->cfg_key && w->cfg_desc ? 0 : KVP_ENOMEM;
}

/* The TP-independent layout's conditions (worker.h tp_independent): sets
 * w->by_head and w->nloc, or KVP_ECONFIG with a message. */
static int head_layout_check(kvp_worker *w, const kvp_worker_cfg *cfg, char *err, size_t errlen)
{
    if (cfg->dcp_size > 1) {
        set_err(err, errlen, "the TP-independent layout needs dcp_size 1 (DCP shards tokens)");
        return KVP_ECONFIG;
    }
    int tp = cfg->tp_size;
    for (size_t g = 0; g < cfg->ngroups; g++) {
        const kvp_worker_group *gr = &cfg->groups[g];
        int n = group_heads(gr);
        if (gr->key_spec == KVP_KEY_SPEC_MAMBA || n < 1 || (n % tp != 0 && tp % n != 0)) {
            set_err(err, errlen, "the TP-independent layout needs attention or MLA groups whose "
                                 "KV heads are a multiple or a divisor of tp_size (a Mamba "
                                 "state is rank-specific)");
            return KVP_ECONFIG;
        }
        uint32_t loc = (uint32_t)(n >= tp ? n / tp : 1);
        if (g > 0 && loc != w->nloc) {
            set_err(err, errlen, "the TP-independent layout needs the same KV heads per rank "
                                 "in every group");
            return KVP_ECONFIG;
        }
        w->nloc = loc;
    }
    w->by_head = 1;
    return 0;
}

int kvp_worker_create(const kvp_worker_cfg *cfg, kvp_worker **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!cfg || !valid_rank(cfg->tp_rank, cfg->tp_size) ||
        !valid_rank(cfg->pcp_rank, cfg->pcp_size) || !valid_rank(cfg->dcp_rank, cfg->dcp_size) ||
        !valid_rank(cfg->pp_rank, cfg->pp_size) || cfg->role < KVP_WORKER_PRODUCER ||
        cfg->role > KVP_WORKER_BOTH) {
        set_err(err, errlen, "invalid ranks or role");
        return KVP_EINVALID_PARAMS;
    }
    const char *fp = cfg->config_fingerprint, *desc = cfg->config_description;
    if ((fp && *fp && !kvp_key_fingerprint_valid(fp)) || (desc && *desc && !(fp && *fp))) {
        set_err(err, errlen, "config_fingerprint must be 12..32 lower-case hex digits (and is "
                             "needed by config_description)");
        return KVP_EINVALID_PARAMS;
    }
    kvp_worker *w = kvp_calloc(1, sizeof *w);
    if (!w)
        return KVP_ENOMEM;
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->send_cv, NULL);
    pthread_cond_init(&w->recv_cv, NULL);
    pthread_cond_init(&w->idle_cv, NULL);
    w->role = cfg->role;
    w->can_put = (cfg->role & KVP_WORKER_PRODUCER) || cfg->save_decode_cache;
    w->capacity_only = !w->can_put && !cfg->enable_lookup;
    w->tp_rank = cfg->tp_rank;
    w->tp_size = cfg->tp_size;
    w->pcp_size = cfg->pcp_size;
    w->dcp_size = cfg->dcp_size;
    w->pp_size = cfg->pp_size;
    w->eagle_prefix_hashing = cfg->eagle_prefix_hashing;
    w->use_eagle = cfg->use_eagle;
    w->enable_kv_events = cfg->enable_kv_events;
    w->staging_budget = cfg->staging_budget;
    w->nrecv = cfg->num_recv_threads ? cfg->num_recv_threads : 1;
    w->fence = cfg->fence;
    w->fence_arg = cfg->fence_arg;
    /* a pool that cannot be reached is no error: the worker starts without
     * it (poollink.h); a configuration error is */
    int rc = kvp_plink_open(cfg->store_config, &w->link, err, errlen);
    if (rc != 0)
        goto fail;
    rc = staging_env(w, err, errlen);
    if (rc != 0)
        goto fail;
    if (w->capacity_only) {
        *out = w;
        return 0;
    }
    rc = KVP_EINVALID_PARAMS;
    if (!cfg->groups || cfg->ngroups == 0 || cfg->ngroups > KVP_COORD_MAX_GROUPS ||
        cfg->num_gpu_blocks == 0) {
        set_err(err, errlen, "need 1..64 KV-cache groups and num_gpu_blocks > 0");
        goto fail;
    }
    w->ng = cfg->ngroups;
    if (cfg->tp_independent && (rc = head_layout_check(w, cfg, err, errlen)) != 0)
        goto fail;
    struct kvp_coord_group specs[KVP_COORD_MAX_GROUPS];
    for (size_t g = 0; g < w->ng; g++)
        specs[g] = cfg->groups[g].spec;
    rc = kvp_coord_resolve_block_sizes(specs, w->ng, cfg->hash_block_size, &w->L, &w->H);
    if (rc != 0) {
        set_err(err, errlen, "KV-cache group block sizes are not multiples of the hash block size");
        goto fail;
    }
    struct kvp_coord_cfg cc = {
        .groups = specs,
        .ngroups = w->ng,
        .scheduler_block_size = w->L,
        .hash_block_size = w->H,
        .use_eagle = cfg->use_eagle,
        .retention_interval = cfg->retention_interval,
        .dcp_world_size = (uint32_t)cfg->dcp_size,
    };
    rc = kvp_coord_create(&w->coord, &cc);
    if (rc != 0) {
        set_err(err, errlen, "unsupported KV-cache groups");
        goto fail;
    }
    rc = KVP_ENOMEM;
    w->B = kvp_calloc(w->ng, sizeof *w->B);
    w->factor = kvp_calloc(w->ng, sizeof *w->factor);
    w->prefix = kvp_calloc(w->ng, sizeof *w->prefix);
    w->prefix_len = kvp_calloc(w->ng, sizeof *w->prefix_len);
    w->lk_buf = kvp_calloc(w->ng, sizeof *w->lk_buf);
    w->lk_off = kvp_calloc(w->ng, sizeof *w->lk_off);
    w->lk_n = kvp_calloc(w->ng, sizeof *w->lk_n);
    w->tdb = kvp_calloc(w->ng, sizeof *w->tdb);
    w->hprefix = kvp_calloc(w->ng, sizeof *w->hprefix);
    w->hprefix_off = kvp_calloc(w->ng, sizeof *w->hprefix_off);
    if (!w->B || !w->factor || !w->prefix || !w->prefix_len || !w->lk_buf || !w->lk_off ||
        !w->lk_n || !w->tdb || !w->hprefix || !w->hprefix_off)
        goto fail;
    rc = kvp_tdb_layout_init(&w->layout, cfg->num_gpu_blocks);
    if (rc != 0)
        goto fail;
    w->layout.heads = w->by_head ? w->nloc : 0;
    w->layout_ok = 1;
    for (size_t g = 0; g < w->ng; g++) {
        w->B[g] = cfg->groups[g].spec.block_size;
        rc = kvp_key_tp_factor(&cfg->groups[g].key_spec, 1, cfg->tp_size,
                               cfg->groups[g].num_kv_heads, cfg->dcp_size, &w->factor[g]);
        if (rc == 0)
            rc = kvp_tdb_init(&w->tdb[g], w->B[g], w->H, &w->layout);
        if (rc == 0)
            rc = build_prefixes(w, cfg, g);
        if (rc != 0) {
            set_err(err, errlen, "invalid group key metadata (spec, heads, model or prefix)");
            goto fail;
        }
    }
    if (cfg->pool_blocks) {
        rc = KVP_ENOMEM;
        if (!(w->block_group = kvp_calloc(w->ng, sizeof *w->block_group)))
            goto fail;
        for (size_t g = 0; g < w->ng; g++) {
            int eg = cfg->engine_group_ids ? cfg->engine_group_ids[g] : (int)g;
            /* a block of more parts than the protocol counts: stored without */
            w->block_group[g] = eg >= 0 && eg <= 31 && w->lk_n[g] <= UINT16_MAX ? eg : -1;
        }
    }
    if (desc && *desc && w->can_put && cfg->tp_rank == 0 &&
        cfg->pcp_rank == 0 && cfg->dcp_rank == 0 && cfg->pp_rank == 0) {
        if ((rc = config_object_init(w, cfg)) != 0)
            goto fail;
        kvp_client *c = kvp_plink_client(w->link);
        if (c)
            put_config_object(w, c);
    }
    *out = w;
    return 0;
fail:
    kvp_worker_destroy(w);
    return rc;
}

int kvp_worker_register_kv_caches(kvp_worker *w, const kvp_tdb_tensor *tensors, size_t n)
{
    if (w->capacity_only)
        return 0;
    if (w->registered || !tensors || n == 0)
        return KVP_EINVALID_PARAMS;
    for (size_t i = 0; i < n; i++) {
        size_t before = w->layout.nsegs;
        int kind = 0;
        int rc = kvp_tdb_layout_add_tensor(&w->layout, &tensors[i], &kind);
        if (rc != 0)
            return rc;
        if (kind != KVP_TDB_DUPLICATE && w->layout.nsegs > before) {
            const kvp_tdb_segment *s = &w->layout.segs[before];
            rc = kvp_plink_register_buffer(w->link, s->region, s->region_len);
            if (rc != 0)
                KVP_ERROR(MOD, "register_buffer(%p, %zu): %s", (void *)s->region, s->region_len,
                          kvp_err_name(rc));
        }
    }
    if (w->can_put) {
        if (pthread_create(&w->send_th, NULL, send_main, w) != 0)
            return KVP_EINTERNAL_ERROR;
        w->send_started = 1;
    }
    w->recv_th = kvp_calloc(w->nrecv, sizeof *w->recv_th);
    if (!w->recv_th)
        return KVP_ENOMEM;
    for (unsigned i = 0; i < w->nrecv; i++) {
        if (pthread_create(&w->recv_th[i], NULL, recv_main, w) != 0)
            return KVP_EINTERNAL_ERROR;
        w->recv_started++;
    }
    w->registered = 1;
    KVP_INFO(MOD, "started %u KV-load receive thread(s)", w->recv_started);
    return 0;
}

void kvp_worker_drain(kvp_worker *w)
{
    pthread_mutex_lock(&w->lock);
    while (w->send_busy || w->recv_busy)
        pthread_cond_wait(&w->idle_cv, &w->lock);
    pthread_mutex_unlock(&w->lock);
}

void kvp_worker_destroy(kvp_worker *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->lock);
    w->stop = 1; /* threads exit once their queue is empty */
    pthread_cond_broadcast(&w->send_cv);
    pthread_cond_broadcast(&w->recv_cv);
    pthread_mutex_unlock(&w->lock);
    if (w->send_started)
        pthread_join(w->send_th, NULL);
    for (unsigned i = 0; i < w->recv_started; i++)
        pthread_join(w->recv_th[i], NULL);
    kvp_free(w->recv_th);
    for (job *j = w->sq_head, *n; j; j = n) { /* never started: nothing queued */
        n = j->next;
        job_free(j);
    }
    for (job *j = w->rq_head, *n; j; j = n) {
        n = j->next;
        job_free(j);
    }
    kvp_plink_close(w->link);
    kvp_free(w->cfg_key);
    kvp_free(w->cfg_desc);
    kvp_coord_destroy(w->coord);
    for (size_t g = 0; g < w->ng; g++) {
        if (w->prefix)
            kvp_free(w->prefix[g]);
        if (w->lk_buf)
            kvp_free(w->lk_buf[g]);
        if (w->lk_off)
            kvp_free(w->lk_off[g]);
    }
    kvp_free(w->B);
    kvp_free(w->factor);
    for (size_t g = 0; w->hprefix && g < w->ng; g++) {
        kvp_free(w->hprefix[g]);
        kvp_free(w->hprefix_off ? w->hprefix_off[g] : NULL);
    }
    kvp_free(w->hprefix);
    kvp_free(w->hprefix_off);
    kvp_free(w->block_group);
    kvp_free(w->prefix);
    kvp_free(w->prefix_len);
    kvp_free(w->lk_buf);
    kvp_free(w->lk_off);
    kvp_free(w->lk_n);
    kvp_free(w->tdb);
    if (w->layout_ok)
        kvp_tdb_layout_free(&w->layout);
    for (size_t i = 0; i < w->nreqs; i++)
        kvp_free(w->reqs[i].id);
    kvp_free(w->reqs);
    kvp_worker_ids_free(&w->recv_done);
    kvp_worker_ids_free(&w->aborted);
    kvp_worker_ids_free(&w->had_load);
    for (job *j = w->unreported, *nx; j; j = nx) {
        nx = j->next;
        job_free(j);
    }
    kvp_free(w->lerr);
    kvp_worker_ids_free(&w->lfail);
    kvp_worker_events_free(w->ev, w->nev);
    pthread_cond_destroy(&w->send_cv);
    pthread_cond_destroy(&w->recv_cv);
    pthread_cond_destroy(&w->idle_cv);
    pthread_mutex_destroy(&w->lock);
    kvp_free(w);
}

/* ------------------------------------------------------------ get_finished §10.2 */

static int str_eq(const kvp_meta_str *s, const char *id)
{
    return strlen(id) == s->len && memcmp(s->p, id, s->len) == 0;
}

/* Preemption of a tracked request (caller holds w->lock): its save state
 * is reset; jobs still queued become stale (generation) and a request with
 * nothing in flight is forgotten. */
static void preempt_locked(kvp_worker *w, sreq *e)
{
    if (e->inflight == 0 && !e->finished) {
        sreq_del(w, e);
    } else {
        e->gen++;
        e->saved = 0;
        e->skip = 0;
        e->detached = 1;
    }
}

/* Caller holds w->lock: 1 if a receive thread runs a load of id. */
static int load_running_locked(kvp_worker *w, const char *id)
{
    for (const job *j = w->rrun; j; j = j->next)
        if (strcmp(j->req_id, id) == 0)
            return 1;
    return 0;
}

/*
 * Caller holds w->lock. 1 if the load of id has not been reported in
 * done_recving yet: queued (the job is dropped now -- the engine finished
 * the request, its blocks are not needed -- and its id is recorded as
 * finished receiving, no block marked invalid), running, or ended but not
 * yet handed over.
 */
static int load_pending_locked(kvp_worker *w, const char *id)
{
    int pending = 0;
    job *prev = NULL;
    for (job *j = w->rq_head, *nx; j; j = nx) {
        nx = j->next;
        if (strcmp(j->req_id, id) != 0) {
            prev = j;
            continue;
        }
        *(prev ? &prev->next : &w->rq_head) = nx;
        if (w->rq_tail == j)
            w->rq_tail = prev;
        w->recv_busy--;
        pending = 1;
        if (ids_add(&w->recv_done, j->req_id) != 0) {
            j->next = w->unreported; /* reported by a later get_finished */
            w->unreported = j;
        } else {
            job_free(j);
        }
    }
    if (pending)
        pthread_cond_broadcast(&w->idle_cv);
    if (load_running_locked(w, id) || kvp_worker_ids_has(&w->recv_done, id))
        pending = 1;
    for (const job *j = w->unreported; j && !pending; j = j->next)
        pending = strcmp(j->req_id, id) == 0;
    return pending;
}

int kvp_worker_handle_preemptions(kvp_worker *w, const char *const *ids, size_t n)
{
    if (w->capacity_only || n == 0)
        return 0;
    if (!ids)
        return KVP_EINVALID_PARAMS;
    pthread_mutex_lock(&w->lock);
    for (size_t i = 0; i < n; i++) {
        if (!ids[i])
            continue;
        for (;;) {
            /* drop its queued (not started) store jobs */
            job *prev = NULL;
            for (job *j = w->sq_head, *nx; j; j = nx) {
                nx = j->next;
                if (strcmp(j->req_id, ids[i]) != 0) {
                    prev = j;
                    continue;
                }
                *(prev ? &prev->next : &w->sq_head) = nx;
                if (w->sq_tail == j)
                    w->sq_tail = prev;
                sreq *e = sreq_find(w, ids[i]);
                if (KVP_ALWAYS(e && e->inflight))
                    e->inflight--;
                KVP_ASSERT(w->send_busy > 0);
                w->send_busy--;
                job_free(j);
                pthread_cond_broadcast(&w->idle_cv);
            }
            /* wait for the one it runs, if any: at most that job's puts */
            if (!w->send_cur || strcmp(w->send_cur->req_id, ids[i]) != 0)
                break;
            pthread_cond_wait(&w->idle_cv, &w->lock);
        }
        sreq *e = sreq_find(w, ids[i]);
        if (e)
            preempt_locked(w, e);
    }
    pthread_mutex_unlock(&w->lock);
    return 0;
}

int kvp_worker_get_finished(kvp_worker *w, const char *const *finished, size_t nfinished,
                            const kvp_meta_step *meta, kvp_worker_ids *done_sending,
                            kvp_worker_ids *done_recving)
{
    if (w->capacity_only)
        return 0;
    if (!w->registered)
        return KVP_EINVALID_PARAMS;
    /* Deep copies first, outside the lock. */
    job *lh = NULL, *lt = NULL, *sh = NULL, *st = NULL;
    size_t nl = 0, ns = 0;
    int rc = 0;
    /* A request that cannot be turned into jobs (malformed, or out of
     * memory) fails alone: its load finishes at once with every block
     * invalid (the engine recomputes them), its save is dropped but the
     * request is still tracked so that finishing it is reported. */
    char **bad_load = NULL, **bad_save = NULL;
    size_t nbl = 0, nbs = 0;
    if (meta && meta->nreqs) {
        bad_load = kvp_calloc(meta->nreqs, sizeof *bad_load);
        bad_save = kvp_calloc(meta->nreqs, sizeof *bad_save);
        if (!bad_load || !bad_save)
            rc = KVP_ENOMEM;
    }
    for (uint32_t i = 0; rc == 0 && meta && i < meta->nreqs; i++) {
        const kvp_meta_req *r = &meta->reqs[i];
        int load = r->load_spec && r->load_spec->can_load;
        int save = r->can_save == KVP_META_TRUE && w->can_put;
        if (!load && !save)
            continue;
        int bad = r->ngroups != w->ng || r->req_id.len == 0 ||
                  (r->nhashes && r->hash_len == 0) || r->hash_len > KVP_META_MAX_HASH_LEN;
        job *made[2] = {NULL, NULL};
        for (int pass = 0; pass < 2 && !bad; pass++)
            if (pass == 0 ? load : save)
                bad = (made[pass] = job_from_req(r)) == NULL;
        if (bad) {
            job_free(made[0]);
            job_free(made[1]);
            KVP_ERROR(MOD, "step request %.*s cannot be served (malformed or out of memory)",
                      (int)(r->req_id.len > 64 ? 64 : r->req_id.len), (const char *)r->req_id.p);
            char *id = r->req_id.len ? kvp_strndup((const char *)r->req_id.p, r->req_id.len) : NULL;
            if (id && load) {
                for (uint32_t g = 0; g < r->ngroups; g++)
                    mark_invalid(w, id, r->block_ids[g].ids, r->block_ids[g].n);
                bad_load[nbl++] = id;
                id = save ? kvp_strdup(id) : NULL;
            }
            if (id && save)
                bad_save[nbs++] = id;
            else
                kvp_free(id);
            continue;
        }
        if (made[0]) {
            made[0]->ls.token_len = made[0]->ls.kvpool_cached_tokens;
            *(lt ? &lt->next : &lh) = made[0];
            lt = made[0];
            nl++;
        }
        if (made[1]) {
            *(st ? &st->next : &sh) = made[1];
            st = made[1];
            ns++;
        }
    }
    pthread_mutex_lock(&w->lock);
    uint64_t step_no = ++w->step;
    /* every request this step asks to load, served or failed alone */
    for (uint32_t i = 0; rc == 0 && meta && i < meta->nreqs; i++) {
        const kvp_meta_req *r = &meta->reqs[i];
        if (r->load_spec && r->load_spec->can_load && ids_add(&w->had_load, r->req_id.p) != 0) {
            KVP_ERROR(MOD, "out of memory recording the load of %s", r->req_id.p);
            rc = KVP_ENOMEM;
        }
    }
    if (rc == 0) {
        /* in-flight counter += 1 before the job is visible to the thread */
        for (job *j = sh; j; j = j->next) {
            sreq *e = sreq_get(w, j->req_id);
            if (!e) {
                rc = KVP_ENOMEM;
                break;
            }
        }
    }
    if (rc == 0) {
        for (job *j = sh; j; j = j->next) {
            sreq *e = sreq_find(w, j->req_id);
            e->inflight++;
            e->detached = 0; /* saving again: the scheduler delays its free */
            j->gen = e->gen;
            j->step = step_no;
        }
        if (lh) {
            *(w->rq_tail ? &w->rq_tail->next : &w->rq_head) = lh;
            w->rq_tail = lt;
            w->recv_busy += nl;
            pthread_cond_broadcast(&w->recv_cv);
        }
        if (sh) {
            *(w->sq_tail ? &w->sq_tail->next : &w->sq_head) = sh;
            w->sq_tail = st;
            w->send_busy += ns;
            pthread_cond_signal(&w->send_cv);
        }
        lh = sh = NULL;
    }
    for (size_t i = 0; i < nbl; i++) { /* failed alone: finished, all blocks invalid */
        if (ids_add(&w->recv_done, bad_load[i]) != 0)
            rc = KVP_ENOMEM;
        kvp_free(bad_load[i]);
    }
    for (size_t i = 0; i < nbs; i++) { /* tracked, so its finish is reported */
        if (!sreq_get(w, bad_save[i]))
            rc = KVP_ENOMEM;
        kvp_free(bad_save[i]);
    }
    kvp_free(bad_load);
    kvp_free(bad_save);
    /* (a) preempted: reset the save state; queued jobs become stale. */
    for (uint32_t i = 0; meta && i < meta->npreempted; i++)
        for (size_t k = 0; k < w->nreqs; k++)
            if (str_eq(&meta->preempted[i], w->reqs[k].id)) {
                preempt_locked(w, &w->reqs[k]);
                break;
            }
    /* (c) this step's finished ids: remember those with stores in flight;
     * those a step asked to load go to `aborted` (reported in done_sending
     * once the load ended, whether it ended long ago or is still running) */
    for (size_t i = 0; i < nfinished; i++) {
        if (!finished || !finished[i])
            continue;
        sreq *e = sreq_find(w, finished[i]);
        if (e)
            e->finished = 1;
        int pend = load_pending_locked(w, finished[i]);
        int had = ids_take(&w->had_load, finished[i]);
        if ((pend || had) && ids_add(&w->aborted, finished[i]) != 0) {
            KVP_ERROR(MOD, "out of memory recording the aborted load of %s", finished[i]);
            rc = KVP_ENOMEM;
        }
    }
    /* aborted loads whose job ended (and no store in flight): done sending */
    for (size_t i = 0; i < w->aborted.n;) {
        char *id = w->aborted.ids[i];
        sreq *e = sreq_find(w, id);
        if (load_running_locked(w, id) || (e && e->inflight)) {
            i++;
            continue;
        }
        if (ids_add(done_sending, id) != 0) {
            rc = KVP_ENOMEM;
            i++;
            continue;
        }
        if (e)
            sreq_del(w, e);
        kvp_free(id);
        w->aborted.ids[i] = w->aborted.ids[--w->aborted.n];
    }
    /* (b) report every finished request with nothing in flight */
    for (size_t k = 0; k < w->nreqs;) {
        sreq *e = &w->reqs[k];
        if (e->finished && kvp_worker_ids_has(&w->aborted, e->id)) {
            k++; /* reported by the aborted-load rule once its load ended */
        } else if (e->finished && e->inflight == 0 && e->detached) {
            sreq_del(w, e); /* preempted, then finished: never reported */
        } else if (e->finished && e->inflight == 0) {
            if (ids_add(done_sending, e->id) != 0) {
                rc = KVP_ENOMEM;
                k++;
                continue;
            }
            sreq_del(w, e);
        } else {
            k++;
        }
    }
    for (job **pp = &w->unreported; *pp;) { /* finished loads not yet recorded */
        job *j = *pp;
        if (ids_add(&w->recv_done, j->req_id) == 0) {
            *pp = j->next;
            job_free(j);
        } else {
            pp = &j->next;
        }
    }
    /* hand over what fits; what could not be copied stays for next time
     * (never reported twice, never lost) */
    size_t copied = 0;
    while (copied < w->recv_done.n && ids_add(done_recving, w->recv_done.ids[copied]) == 0)
        copied++;
    if (copied < w->recv_done.n)
        rc = KVP_ENOMEM;
    for (size_t i = 0; i < copied; i++)
        kvp_free(w->recv_done.ids[i]);
    if (copied && copied < w->recv_done.n)
        memmove(w->recv_done.ids, w->recv_done.ids + copied,
                (w->recv_done.n - copied) * sizeof *w->recv_done.ids);
    w->recv_done.n -= copied;
    pthread_mutex_unlock(&w->lock);
    for (job *j = lh, *n; j; j = n) {
        n = j->next;
        job_free(j);
    }
    for (job *j = sh, *n; j; j = n) {
        n = j->next;
        job_free(j);
    }
    return rc;
}

uint64_t kvp_worker_next_step(kvp_worker *w)
{
    pthread_mutex_lock(&w->lock);
    uint64_t n = w->step + 1;
    pthread_mutex_unlock(&w->lock);
    return n;
}

int kvp_worker_load_errors(kvp_worker *w, uint32_t **ids, size_t *n)
{
    pthread_mutex_lock(&w->lock);
    *ids = w->lerr;
    *n = w->nlerr;
    w->lerr = NULL;
    w->nlerr = w->caplerr = 0;
    pthread_mutex_unlock(&w->lock);
    return 0;
}

int kvp_worker_load_failed(kvp_worker *w, kvp_worker_ids *out)
{
    int rc = 0;
    pthread_mutex_lock(&w->lock);
    size_t k = 0;
    while (k < w->lfail.n && ids_add(out, w->lfail.ids[k]) == 0)
        k++;
    if (k < w->lfail.n)
        rc = KVP_ENOMEM; /* what could not be handed over stays for next time */
    for (size_t i = 0; i < k; i++)
        kvp_free(w->lfail.ids[i]);
    memmove(w->lfail.ids, w->lfail.ids + k, (w->lfail.n - k) * sizeof *w->lfail.ids);
    w->lfail.n -= k;
    pthread_mutex_unlock(&w->lock);
    return rc;
}

/* ------------------------------------------------------------ lookup §10.5 */

/*
 * The lookup asks EXIST_LEASE (kvp_client_exist_lease): every key it finds
 * in DRAM is held by the master (a read lease), so what it counted is still
 * there when the load's GET comes: the GET takes the hold over and its
 * RELEASE ends it; a hold no GET claims ends lease_ttl after the object's
 * latest lease. $KVPOOL_LOOKUP_LEASE=0 makes it ask plain EXIST, as
 * releases before it did (no lease, no size check): a diagnosis switch, and
 * the "before" of `kvpool bench sim --churn`. Read once per process.
 */
static int lk_lease_off;
static pthread_once_t lk_lease_once = PTHREAD_ONCE_INIT;
static void lk_lease_env(void)
{
    const char *e = getenv("KVPOOL_LOOKUP_LEASE");
    lk_lease_off = e && strcmp(e, "0") == 0;
}

/* Bytes a load of this rank moves for one block of group g: the pieces
 * kvp_tdb_prepare_value gives a chunk (one block_len per segment; a partial
 * chunk moves its whole block), i.e. the size its get needs the value to
 * have. 0 = unknown (no KV cache registered yet): no size check. */
static uint64_t lk_block_bytes(const kvp_worker *w, size_t g)
{
    if (!w->registered)
        return 0;
    const kvp_tdb_layout *l = w->tdb[g].layout;
    if (w->by_head)
        return kvp_tdb_head_bytes(l); /* one head's object */
    uint64_t sum = 0;
    for (size_t i = 0; i < l->nsegs; i++)
        sum += l->segs[i].block_len;
    return sum;
}

/* The "@pp_rank:R@group:G" tail of a key prefix (keys.h): its last
 * "@pp_rank:" (the model name before it may hold anything). */
static const char *lk_stage_tail(const char *prefix)
{
    const char *t = prefix;
    for (const char *p = prefix; (p = strstr(p, "@pp_rank:")) != NULL; p++)
        t = p;
    return t;
}

/* The hit of a lookup whose keys answered res (> 0 present), unit i of
 * group mg[i] (hash mh[i]) having the lk_n[mg[i]] keys from r on: the
 * longest cache hit over the units all of whose keys are present, below
 * num_tokens (the last token must be recomputed). 0 or < 0. */
static int lk_hit(kvp_worker *w, const struct kvp_coord_hashes *all, size_t T,
                  uint32_t num_tokens, int apply_eagle, struct kvp_coord_mask *m,
                  const uint32_t *mg, const uint8_t *const *mh, size_t nm, const int *res,
                  size_t *h)
{
    struct kvp_coord_pool *pool = NULL;
    *h = 0;
    int rc = kvp_coord_pool_create(&pool, all->hash_len, nm);
    size_t r = 0;
    for (size_t i = 0; rc == 0 && i < nm; i++) {
        int present = 1;
        for (size_t p = 0; p < w->lk_n[mg[i]]; p++)
            present &= res[r++] > 0;
        if (present)
            rc = kvp_coord_pool_add(pool, mg[i], mh[i]);
    }
    if (rc == 0)
        rc = kvp_coord_find_longest_cache_hit(w->coord, all, T, pool, apply_eagle, m, h);
    if (rc == 0 && *h >= num_tokens) { /* the last token must be recomputed */
        size_t usable = kvp_coord_align_lookup_length(w->coord, num_tokens - 1);
        *h = 0;
        if (usable > 0)
            rc = kvp_coord_find_longest_cache_hit(w->coord, all, usable, pool, apply_eagle, m, h);
    }
    kvp_coord_pool_destroy(pool);
    return rc;
}

int kvp_worker_lookup(kvp_worker *w, uint32_t num_tokens, const uint8_t *hashes, size_t nhashes,
                      size_t hash_len, int apply_eagle, uint32_t *hit)
{
    *hit = 0;
    if (w->capacity_only)
        return 0;
    if ((nhashes && !hashes) || (nhashes && (hash_len == 0 || hash_len > KVP_META_MAX_HASH_LEN)))
        return KVP_EINVALID_PARAMS;
    size_t T = kvp_coord_align_lookup_length(w->coord, num_tokens);
    if (!nhashes || T == 0)
        return 0;
    kvp_client *cl = kvp_plink_client(w->link);
    if (!cl) { /* the pool is unavailable: a miss, at once */
        kvp_plink_skipped(w->link, KVP_PLINK_SKIP_LOOKUP);
        return 0;
    }
    int fine = kvp_coord_partial_hits(w->coord);
    struct kvp_coord_mask m[KVP_COORD_MAX_GROUPS];
    struct kvp_coord_hashes all = {hashes, nhashes, hash_len, 0}, gh[KVP_COORD_MAX_GROUPS];
    uint8_t *bits = NULL;
    int rc = masks_alloc(w, T, m, &bits);
    if (rc != 0)
        return rc;
    if (!fine && (rc = kvp_coord_lookup_mask(w->coord, T, apply_eagle, m)) != 0)
        goto out_bits;
    /* Count the candidates. */
    size_t units[KVP_COORD_MAX_GROUPS], ncand = 0, nmeta = 0;
    for (size_t g = 0; g < w->ng; g++) {
        if (fine) {
            gh[g] = all;
            units[g] = nhashes < T / w->H ? nhashes : T / w->H;
        } else {
            rc = kvp_coord_block_hashes_for_spec(&all, w->H, w->B[g], &gh[g]);
            if (rc != 0)
                goto out_bits;
            size_t n = (T + w->B[g] - 1) / w->B[g];
            if (gh[g].n < n)
                n = gh[g].n;
            units[g] = m[g].all || n < m[g].len ? n : m[g].len;
        }
        nmeta += units[g];
        ncand += units[g] * w->lk_n[g];
    }
    if (ncand == 0)
        goto out_bits;
    size_t maxp = 0;
    for (size_t g = 0; g < w->ng; g++)
        for (size_t p = 0; p < w->lk_n[g]; p++) {
            size_t l = strlen(w->lk_buf[g] + w->lk_off[g][p]);
            if (l > maxp)
                maxp = l;
        }
    size_t stride = maxp + 2 + 2 * hash_len;
    char *kb = kvp_malloc(ncand * stride);
    const char **keys = kvp_calloc(ncand, sizeof *keys);
    int *res = kvp_calloc(ncand, sizeof *res);
    uint64_t *sz = NULL;
    uint32_t *mg = kvp_calloc(nmeta ? nmeta : 1, sizeof *mg);
    uint32_t *mc = kvp_calloc(nmeta ? nmeta : 1, sizeof *mc);
    const uint8_t **mh = kvp_calloc(nmeta ? nmeta : 1, sizeof *mh);
    /* the lease request: each key of the hit once per rank that will get
     * it (factor: the TP ranks sharing its namespace), one hold each */
    size_t maxf = 1;
    for (size_t g = 0; g < w->ng; g++)
        if ((size_t)w->factor[g] > maxf)
            maxf = (size_t)w->factor[g];
    size_t *sel = kvp_calloc(ncand * maxf, sizeof *sel);
    sz = kvp_calloc(ncand * maxf, sizeof *sz);
    const char **skeys = kvp_calloc(ncand * maxf, sizeof *skeys);
    int *sres = kvp_calloc(ncand * maxf, sizeof *sres);
    uint64_t *sneed = kvp_calloc(ncand * maxf, sizeof *sneed);
    /* per group and lookup prefix: the size its keys must have (0 = any):
     * this rank's block bytes for the prefixes of its own pipeline stage
     * (every TP / PCP / DCP rank of a stage holds blocks of one size); a
     * stage's layers are its own, so another stage's size is not known */
    size_t nwant = 0, want_off[KVP_COORD_MAX_GROUPS];
    for (size_t g = 0; g < w->ng; g++) {
        want_off[g] = nwant;
        nwant += w->lk_n[g];
    }
    uint64_t *want = kvp_calloc(nwant ? nwant : 1, sizeof *want);
    rc = KVP_ENOMEM;
    if (!kb || !keys || !res || !sz || !mg || !mc || !mh || !sel || !skeys || !sres || !sneed ||
        !want)
        goto out;
    for (size_t g = 0; g < w->ng; g++) {
        uint64_t bb = lk_block_bytes(w, g);
        const char *own = lk_stage_tail(w->prefix[g]);
        for (size_t p = 0; bb && p < w->lk_n[g]; p++)
            if (strcmp(lk_stage_tail(w->lk_buf[g] + w->lk_off[g][p]), own) == 0)
                want[want_off[g] + p] = bb;
    }
    size_t nk = 0, nm = 0;
    for (size_t g = 0; g < w->ng; g++)
        for (size_t c = 0; c < units[g]; c++) {
            if (!fine && !m[g].all && !m[g].bits[c]) /* mask before touching hashes */
                continue;
            const uint8_t *h = gh[g].data + c * (gh[g].stride ? gh[g].stride : hash_len);
            mg[nm] = (uint32_t)g;
            mc[nm] = (uint32_t)c;
            mh[nm++] = h;
            for (size_t p = 0; p < w->lk_n[g]; p++) {
                const char *pre = w->lk_buf[g] + w->lk_off[g][p];
                size_t len;
                char *k = kb + nk * stride;
                if ((rc = kvp_key_build_key_string(pre, strlen(pre), h, hash_len, k, stride,
                                                   &len)) != 0)
                    goto out;
                keys[nk++] = k;
            }
        }
    rc = 0;
    if (nk == 0)
        goto out;
    uint64_t t0 = kvp_now_ns();
    int erc = kvp_client_exist(cl, keys, nk, res);
    if (erc < 0) {
        stat_rec(w, KVP_WORKER_OP_LOOKUP_EXISTS, t0, nk, 0, nk, 0, 1);
        if (!kvp_plink_check(w->link, erc, NULL, NULL, 0)) /* an outage: logged once */
            KVP_WARN(MOD, "lookup exist of %zu keys failed: %s", nk, kvp_err_name(erc));
        goto out; /* hit 0 */
    }
    size_t failed = 0;
    for (size_t i = 0; i < nk; i++)
        failed += res[i] < 0;
    /* The client folds a failed exist RPC (master unreachable, timeout)
     * into a negative code per key, and "absent" is 0, never < 0: every
     * key failed is a store error (§12: a lookup_exists error), not a
     * partial result. */
    if (failed == nk && !kvp_plink_check(w->link, 0, NULL, res, nk))
        KVP_WARN(MOD, "lookup exist of %zu keys failed: %s", nk, kvp_err_name(res[0]));
    size_t h = 0;
    if ((rc = lk_hit(w, &all, T, num_tokens, apply_eagle, m, mg, mh, nm, res, &h)) != 0)
        goto out;
    /*
     * "A hit stays a hit until it is loaded": the keys of the units the
     * hit covers (every unit of a group that starts below it: what the
     * loads of the ranks will get, and a little more) are asked again with
     * EXIST_LEASE, which leases each present one for the master's
     * lease_ttl, its holds taken over by the loads' GETs (master.c
     * "leases"). Only those: a present key past a gap is no use and would
     * stay pinned for lease_ttl. A key counts as present only with the size
     * this rank's load will read into (its get of a value of another size
     * would fail): a key of another size (a stale or foreign value under
     * the name) is a miss, counted in the lookup's existing_keys, with one
     * warning per batch at most (rate-limited too). The hit is then that of
     * the second answer (never more than the first).
     */
    pthread_once(&lk_lease_once, lk_lease_env);
    size_t ns = 0, mism = 0, first = 0;
    uint64_t first_need = 0;
    int lerr = 0;
    if (h > 0 && !lk_lease_off) {
        size_t r = 0;
        for (size_t i = 0; i < nm; i++) {
            uint64_t u = fine ? w->H : w->B[mg[i]]; /* tokens of a unit */
            int in = (uint64_t)mc[i] * u < h;
            for (size_t p = 0; p < w->lk_n[mg[i]]; p++, r++)
                for (int f = 0; in && res[r] > 0 && f < w->factor[mg[i]]; f++) {
                    sel[ns] = r;
                    sneed[ns] = want[want_off[mg[i]] + p];
                    skeys[ns++] = keys[r];
                }
        }
        erc = kvp_client_exist_lease(cl, skeys, ns, sres, sz);
        if (erc == KVP_ENOT_SUPPORTED) {
            static int warned; /* once per process: every lookup would say it */
            if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
                KVP_WARN(MOD, "the master does not know EXIST_LEASE (an older release): "
                              "lookup hits are not leased, nor their sizes checked");
        } else if (erc < 0) {
            if (!kvp_plink_check(w->link, erc, NULL, NULL, 0)) /* an outage: logged once */
                KVP_WARN(MOD, "lookup lease of %zu keys failed: %s (a miss)", ns,
                         kvp_err_name(erc));
            lerr = 1;
            h = 0;
        } else {
            size_t sfailed = 0; /* every key failed: a store error, as for the EXIST */
            for (size_t j = 0; j < ns; j++)
                sfailed += sres[j] < 0;
            lerr = ns > 0 && sfailed == ns;
            if (lerr)
                kvp_plink_check(w->link, 0, NULL, sres, ns); /* an outage: the link logs it */
            for (size_t i = 0; i < nk; i++)
                res[i] = 0; /* past the hit: absent now */
            for (size_t j = 0; j < ns; j++) {
                int dup = j > 0 && sel[j - 1] == sel[j];
                int ok = sres[j] > 0 && (!sneed[j] || sz[j] == sneed[j]);
                if (sres[j] > 0 && !ok && !dup && mism++ == 0)
                    first = j, first_need = sneed[j];
                res[sel[j]] = dup ? res[sel[j]] && ok : ok;
            }
            size_t h2 = 0;
            if ((rc = lk_hit(w, &all, T, num_tokens, apply_eagle, m, mg, mh, nm, res, &h2)) != 0)
                goto out;
            if (h2 < h)
                h = h2;
        }
    }
    stat_rec(w, KVP_WORKER_OP_LOOKUP_EXISTS, t0, nk, 0, failed, mism, failed == nk || lerr);
    if (mism)
        KVP_WARN_LIMITED(MOD, "lookup: %zu keys of a hit hold a value of another size than "
                              "a load of this rank reads (e.g. %s: %llu bytes, not %llu): "
                              "counted as misses", mism, skeys[first],
                         (unsigned long long)sz[first], (unsigned long long)first_need);
    *hit = (uint32_t)h;
out:
    kvp_free(kb);
    kvp_free(keys);
    kvp_free(res);
    kvp_free(sz);
    kvp_free(want);
    kvp_free(mg);
    kvp_free(mc);
    kvp_free(mh);
    kvp_free(sel);
    kvp_free(skeys);
    kvp_free(sres);
    kvp_free(sneed);
out_bits:
    kvp_free(bits);
    return rc;
}

int64_t kvp_worker_reset(kvp_worker *w)
{
    pthread_mutex_lock(&w->lock);
    while (w->send_busy)
        pthread_cond_wait(&w->idle_cv, &w->lock);
    pthread_mutex_unlock(&w->lock);
    /* one attempt even while the pool looks down (it may be back); none
     * while the worker never reached it */
    kvp_client *cl = kvp_plink_any_client(w->link);
    return cl ? kvp_client_remove_all(cl, 1 /* force: §9.2 */) : KVP_ERPC_FAIL;
}
