/*
 * tier.c -- the node's SSD tier: master commands onto the disk store; see
 * tier.h.
 *
 * Reports: `rq` is a list of DISK_REPORT bodies being filled, each begun
 * with the segment id and an entry count patched when it is full (REPORT_MAX
 * bytes) or taken. Guarded by `mu`; the eventfd is written when the list
 * goes from empty to not.
 *
 * Loads: a FIFO of jobs (mu + cv) served by LOADERS threads; each reads a
 * record straight into the segment range the master allocated for it.
 */
#include "node/tier.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/buf.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/size.h"
#include "kvpool.h"
#include "node/disk.h"
#include "proto/proto.h"

#define MOD "tier"
#define LOADERS 2
#define REPORT_MAX (1u << 20)     /* bytes of one DISK_REPORT body */
#define TICK_MS 100               /* compaction period */
#define TICK_BUDGET (32ull << 20) /* bytes compaction moves per period */

typedef struct report {
    struct report *next;
    kvp_buf b;
    uint32_t n;
} report;

typedef struct job {
    struct job *next;
    uint64_t size, csum, gen;
    uint32_t page, tlen, klen;
    uint8_t bytes[]; /* tenant, then key */
} job;

/* what on_durable needs to report a spill */
typedef struct cookie {
    uint64_t gen;
    uint32_t page;
} cookie;

struct kvp_tier {
    kvp_disk *disk;
    uint8_t *base;
    uint64_t seg_size, seg_id, capacity;
    int evfd;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    report *rq_head, *rq_tail; /* under mu */
    job *jq_head, *jq_tail;    /* under mu */
    int stop;                  /* under mu */
    pthread_t th[LOADERS];
    struct loader {
        struct kvp_tier *t;
        int compactor;    /* the first loader also compacts */
    } la[LOADERS];
    int nth;
    kvp_tier_stats st;         /* under mu */
    uint64_t usage[4];         /* last USAGE reported (compactor thread) */
};

/* ------------------------------------------------------------ reports */

/* Appends one report entry (any thread). */
static void report_add(kvp_tier *t, uint8_t what, int32_t status, const uint8_t *tenant,
                       uint32_t tlen, const uint8_t *key, uint32_t klen, uint64_t size,
                       uint64_t csum, uint32_t page, uint64_t gen, uint32_t rec)
{
    kvp_disk_ent e = {what, status, {tenant, tlen}, {key, klen}, size, csum, page, gen, rec};
    pthread_mutex_lock(&t->mu);
    int was_empty = t->rq_head == NULL;
    report *r = t->rq_tail;
    if (!r || r->b.len >= REPORT_MAX) {
        r = kvp_calloc(1, sizeof *r);
        if (!r) {
            pthread_mutex_unlock(&t->mu);
            KVP_WARN(MOD, "out of memory: a disk tier report is lost");
            return;
        }
        kvp_buf_init(&r->b, 2 * REPORT_MAX + 2 * 65536);
        kvp_buf_u64(&r->b, t->seg_id);
        kvp_buf_u32(&r->b, 0);
        if (t->rq_tail)
            t->rq_tail->next = r;
        else
            t->rq_head = r;
        t->rq_tail = r;
    }
    size_t mark = r->b.len;
    kvp_enc_disk_ent(&r->b, &e);
    if (r->b.err) {
        r->b.err = 0;
        r->b.len = mark;
        KVP_WARN(MOD, "a disk tier report does not fit: lost");
    } else {
        r->n++;
    }
    pthread_mutex_unlock(&t->mu);
    if (was_empty) {
        uint64_t one = 1;
        if (write(t->evfd, &one, sizeof one) < 0 && errno != EAGAIN)
            KVP_DEBUG(MOD, "eventfd write: %s", strerror(errno));
    }
}

int kvp_tier_take(kvp_tier *t, int (*send)(void *ctx, const uint8_t *body, size_t len),
                  void *ctx)
{
    uint64_t v;
    if (read(t->evfd, &v, sizeof v) < 0 && errno != EAGAIN)
        KVP_DEBUG(MOD, "eventfd read: %s", strerror(errno));
    for (;;) {
        pthread_mutex_lock(&t->mu);
        report *r = t->rq_head;
        if (r) {
            t->rq_head = r->next;
            if (!t->rq_head)
                t->rq_tail = NULL;
        }
        pthread_mutex_unlock(&t->mu);
        if (!r)
            return 0;
        uint8_t *n = r->b.data + 8;
        n[0] = (uint8_t)r->n, n[1] = (uint8_t)(r->n >> 8), n[2] = (uint8_t)(r->n >> 16),
        n[3] = (uint8_t)(r->n >> 24);
        int rc = send(ctx, r->b.data, r->b.len);
        if (rc < 0) { /* back to the front, for the next connection */
            pthread_mutex_lock(&t->mu);
            r->next = t->rq_head;
            t->rq_head = r;
            if (!t->rq_tail)
                t->rq_tail = r;
            pthread_mutex_unlock(&t->mu);
            return rc;
        }
        kvp_buf_free(&r->b);
        kvp_free(r);
    }
}

static void count(kvp_tier *t, uint64_t *ctr, uint64_t n)
{
    pthread_mutex_lock(&t->mu);
    *ctr += n;
    pthread_mutex_unlock(&t->mu);
}

/* ------------------------------------------------- disk store callbacks */

static void on_durable(void *arg, const kvp_disk_rec *r, void *ck, int status)
{
    kvp_tier *t = arg;
    cookie *c = ck;
    report_add(t, KVP_DISK_SPILLED, status, r->tenant, r->tenant_len, r->key, r->key_len,
               r->size, r->csum, c->page, c->gen, status ? 0 : kvp_disk_rec_id(r->seq));
    count(t, status ? &t->st.spill_fails : &t->st.spills, 1);
    kvp_free(c);
}

static void on_dropped(void *arg, const kvp_disk_rec *r, size_t n)
{
    kvp_tier *t = arg;
    for (size_t i = 0; i < n; i++)
        report_add(t, KVP_DISK_GONE, 0, r[i].tenant, r[i].tenant_len, r[i].key, r[i].key_len,
                   r[i].size, r[i].csum, 0, 0, kvp_disk_rec_id(r[i].seq));
    count(t, &t->st.gone, n);
}

/* ------------------------------------------------------------ commands */

static int range_ok(const kvp_tier *t, uint32_t page, uint64_t size)
{
    uint64_t off = (uint64_t)page << 12;
    return size > 0 && off < t->seg_size && size <= t->seg_size - off;
}

static void do_spill(kvp_tier *t, const kvp_disk_ent *e)
{
    int rc = 0;
    if (!range_ok(t, e->page, e->size)) {
        rc = KVP_EINVALID_PARAMS;
    } else {
        const uint8_t *v = t->base + ((uint64_t)e->page << 12);
        if (XXH3_64bits(v, e->size) != e->checksum) {
            /* the DRAM copy is corrupt: never made durable */
            rc = KVP_ECHECKSUM_MISMATCH;
            count(t, &t->st.spill_corrupt, 1);
            KVP_WARN(MOD, "spill of a %llu-byte object refused: its DRAM bytes do not match "
                          "its checksum", (unsigned long long)e->size);
        } else {
            cookie *c = kvp_malloc(sizeof *c);
            if (!c) {
                rc = KVP_ENOMEM;
            } else {
                c->gen = e->generation;
                c->page = e->page;
                struct iovec iov = {(void *)v, e->size};
                rc = kvp_disk_write(t->disk, e->tenant.p, e->tenant.len, e->key.p, e->key.len,
                                    e->checksum, &iov, 1, e->size, c);
                if (rc)
                    kvp_free(c);
            }
        }
    }
    if (rc) { /* not queued: no on_durable will come */
        report_add(t, KVP_DISK_SPILLED, rc, e->tenant.p, e->tenant.len, e->key.p, e->key.len,
                   e->size, e->checksum, e->page, e->generation, 0);
        count(t, &t->st.spill_fails, 1);
    }
}

static void do_load_queue(kvp_tier *t, const kvp_disk_ent *e)
{
    job *j = kvp_malloc(sizeof *j + e->tenant.len + e->key.len);
    if (!j) {
        report_add(t, KVP_DISK_LOADED, KVP_ENOMEM, e->tenant.p, e->tenant.len, e->key.p,
                   e->key.len, e->size, e->checksum, e->page, e->generation, 0);
        return;
    }
    j->next = NULL;
    j->size = e->size;
    j->csum = e->checksum;
    j->gen = e->generation;
    j->page = e->page;
    j->tlen = e->tenant.len;
    j->klen = e->key.len;
    if (e->tenant.len)
        memcpy(j->bytes, e->tenant.p, e->tenant.len);
    memcpy(j->bytes + j->tlen, e->key.p, e->key.len);
    pthread_mutex_lock(&t->mu);
    if (t->jq_tail)
        t->jq_tail->next = j;
    else
        t->jq_head = j;
    t->jq_tail = j;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

/* FORGET removes the record it names and no other: one that names an
 * older record of the key (a FORGET queued before the key was spilled
 * again, answering a stale report) leaves the newer record alone. */
static void do_forget(kvp_tier *t, const kvp_disk_ent *e)
{
    int rc = kvp_disk_forget(t->disk, e->tenant.p, e->tenant.len, e->key.p, e->key.len, e->rec,
                             e->size, e->checksum);
    if (rc == 1)
        KVP_DEBUG(MOD, "FORGET of record %08x (%llu bytes) ignored: the key's record is another "
                       "one", e->rec, (unsigned long long)e->size);
    else if (rc < 0 && rc != KVP_EOBJECT_NOT_FOUND)
        KVP_WARN_LIMITED(MOD, "FORGET of record %08x failed (%s): the record stays", e->rec,
                         kvp_strerror(rc));
    if (rc == 0 || rc == 1 || rc == KVP_EOBJECT_NOT_FOUND)
        count(t, rc == 0 ? &t->st.forgets : rc == 1 ? &t->st.forget_stale : &t->st.forget_missing,
              1);
}

void kvp_tier_command(kvp_tier *t, const uint8_t *body, uint32_t len)
{
    kvp_arena a;
    kvp_arena_init(&a, (size_t)len * 2 + 4096);
    kvp_proto_limits lim;
    kvp_proto_limits_default(&lim);
    lim.max_key = KVP_DISK_MAX_KEY - 1;
    kvp_msg_disk d;
    if (kvp_dec_disk(body, len, &lim, &a, &d) != 0 || d.segment_id != t->seg_id) {
        KVP_WARN(MOD, "a malformed or misdirected DISK_CMD from the master: ignored");
        kvp_arena_free(&a);
        return;
    }
    for (uint32_t i = 0; i < d.n; i++) {
        const kvp_disk_ent *e = &d.e[i];
        switch (e->what) {
        case KVP_DISK_SPILL: do_spill(t, e); break;
        case KVP_DISK_LOAD: do_load_queue(t, e); break;
        case KVP_DISK_FORGET: do_forget(t, e); break;
        default: break; /* reports are not commands */
        }
    }
    kvp_arena_free(&a);
}

/* ------------------------------------------------------------- loaders */

static void load_one(kvp_tier *t, const job *j)
{
    int64_t rc;
    uint64_t csum = 0;
    const uint8_t *tenant = j->bytes, *key = j->bytes + j->tlen;
    if (!range_ok(t, j->page, j->size)) {
        rc = KVP_EINVALID_PARAMS;
    } else {
        uint8_t *dst = t->base + ((uint64_t)j->page << 12);
        rc = kvp_disk_read(t->disk, tenant, j->tlen, key, j->klen, dst, j->size, &csum);
        if (rc >= 0 && ((uint64_t)rc != j->size || csum != j->csum))
            rc = KVP_ECHECKSUM_MISMATCH; /* another value than the master's */
        else if (rc > 0)
            rc = 0;
    }
    report_add(t, KVP_DISK_LOADED, (int32_t)rc, tenant, j->tlen, key, j->klen, j->size, j->csum,
               j->page, j->gen, 0);
    count(t, rc ? &t->st.load_fails : &t->st.loads, 1);
}

/* The tier's figures for the master's `stat`, when they changed (at most
 * every TICK_MS). */
static void usage_report(kvp_tier *t)
{
    kvp_disk_stats ds;
    kvp_disk_get_stats(t->disk, &ds);
    uint64_t u[4] = {ds.used, ds.compacted_bytes, ds.compacted_pages, ds.dropped_pages};
    if (!memcmp(u, t->usage, sizeof u))
        return;
    memcpy(t->usage, u, sizeof u);
    report_add(t, KVP_DISK_USAGE, 0, NULL, 0, (const uint8_t *)"usage", 5, u[0], u[1],
               (uint32_t)u[3], u[2], 0);
}

static void *loader_main(void *arg)
{
    struct loader *la = arg;
    kvp_tier *t = la->t;
    int compactor = la->compactor;
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    for (;;) {
        pthread_mutex_lock(&t->mu);
        while (!t->jq_head && !t->stop) {
            if (!compactor) {
                pthread_cond_wait(&t->cv, &t->mu);
                continue;
            }
            if (pthread_cond_timedwait(&t->cv, &t->mu, &next) == ETIMEDOUT)
                break;
        }
        job *j = t->jq_head;
        if (j) {
            t->jq_head = j->next;
            if (!t->jq_head)
                t->jq_tail = NULL;
        }
        int stop = t->stop && !j;
        pthread_mutex_unlock(&t->mu);
        if (stop)
            return NULL;
        if (j) {
            load_one(t, j);
            kvp_free(j);
        }
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (compactor && (now.tv_sec > next.tv_sec ||
                          (now.tv_sec == next.tv_sec && now.tv_nsec >= next.tv_nsec))) {
            kvp_disk_tick(t->disk, TICK_BUDGET);
            usage_report(t);
            next = now;
            next.tv_nsec += TICK_MS * 1000000L;
            if (next.tv_nsec >= 1000000000L) {
                next.tv_sec++;
                next.tv_nsec -= 1000000000L;
            }
        }
    }
}

/* --------------------------------------------------------------- life */

struct have {
    kvp_tier *t;
    uint64_t n;
};

static void have_one(void *arg, const kvp_disk_rec *r)
{
    struct have *h = arg;
    report_add(h->t, KVP_DISK_HAVE, 0, r->tenant, r->tenant_len, r->key, r->key_len, r->size,
               r->csum, 0, 0, kvp_disk_rec_id(r->seq));
    h->n++;
}

uint64_t kvp_tier_register(kvp_tier *t)
{
    struct have h = {t, 0};
    kvp_disk_each(t->disk, have_one, &h);
    count(t, &t->st.registered, h.n);
    return h.n;
}

/* The size and free bytes of the filesystem holding dir (or, before the
 * store created dir, its nearest existing ancestor); 0 when statvfs cannot
 * tell. */
static uint64_t fs_size(const char *dir, uint64_t *avail)
{
    struct statvfs sv;
    char p[4200];
    snprintf(p, sizeof p, "%s", dir);
    while (statvfs(p, &sv) != 0) {
        size_t n = strlen(p);
        while (n > 1 && p[n - 1] == '/')
            p[--n] = 0;
        char *slash = strrchr(p, '/');
        if (!slash)
            snprintf(p, sizeof p, ".");
        else if (slash == p)
            p[1] = 0;
        else
            *slash = 0;
        if (n <= 1 && (p[0] == '/' || p[0] == '.'))
            return 0; /* the root (or ".") itself did not answer */
    }
    if (avail)
        *avail = (uint64_t)sv.f_bavail * sv.f_frsize;
    return (uint64_t)sv.f_blocks * sv.f_frsize;
}

/* offload_capacity 0: 90 % of the filesystem holding dir, in whole pages */
static uint64_t default_capacity(const char *dir, uint64_t page)
{
    uint64_t c = fs_size(dir, NULL) / 10 * 9;
    return c / page * page;
}

/*
 * An offload_capacity the filesystem cannot hold is a warning, not an
 * error: the tier survives a full disk (a spill that finds no room fails and
 * its victim is dropped as without a tier; spills resume once space returns:
 * test_disk_tier), and Mooncake configs may carry a generous limit. But the
 * tier drops old pages only past its watermarks of capacity, so with a
 * capacity above the filesystem's size its own pages can fill the disk and
 * it then never rotates: spills fail until someone frees space. Above the
 * free space now (plus what its page files already hold) it is the same
 * while other files hold the rest.
 */
static void check_capacity(const kvp_config *cfg, uint64_t cap, uint64_t held)
{
    uint64_t avail = 0, fs = fs_size(cfg->offload_dir, &avail);
    char a[32], b[32], c[32];
    if (fs && cap > fs)
        KVP_WARN(MOD, "key \"offload_capacity\" (%s) exceeds the size of the filesystem of %s "
                      "(%s): the tier can fill the disk before it drops any old page, and then "
                      "refuses spills until space is freed; give at most %s, or 0 (90 %% of the "
                      "filesystem)",
                 kvp_size_format(cap, a, sizeof a), cfg->offload_dir,
                 kvp_size_format(fs, b, sizeof b), b);
    else if (fs && cap > avail + held)
        KVP_WARN(MOD, "key \"offload_capacity\" (%s) exceeds the free space of the filesystem "
                      "of %s (%s free, %s in the tier's pages): other files hold the rest; "
                      "spills are refused (-200) while the disk is full",
                 kvp_size_format(cap, a, sizeof a), cfg->offload_dir,
                 kvp_size_format(avail, b, sizeof b), kvp_size_format(held, c, sizeof c));
}

int kvp_tier_open(const kvp_config *cfg, kvp_segment *seg, uint64_t seg_id, kvp_tier **out,
                  char *err, size_t errlen)
{
    if (!cfg->offload_dir[0]) {
        snprintf(err, errlen, "key \"enable_offload\" needs key \"offload_dir\" (the SSD tier's "
                              "directory)");
        return KVP_ECONFIG;
    }
    kvp_tier *t = kvp_calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, errlen, "out of memory");
        return KVP_ENOMEM;
    }
    t->base = kvp_segment_base(seg);
    t->seg_size = kvp_segment_size(seg);
    t->seg_id = seg_id;
    t->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    pthread_mutex_init(&t->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (t->evfd < 0) {
        snprintf(err, errlen, "eventfd: %s", strerror(errno));
        kvp_tier_close(t);
        return KVP_EIO;
    }
    uint64_t page = cfg->offload_page_size ? cfg->offload_page_size : 128ull << 20;
    uint64_t cap = cfg->offload_capacity;
    if (!cap) {
        /* statvfs needs the directory: the store creates it, so fs_size asks its parent too */
        cap = default_capacity(cfg->offload_dir, page);
        if (cap < 2 * page) {
            snprintf(err, errlen,
                     "key \"offload_capacity\" is 0 (90 %% of the filesystem) but the filesystem "
                     "of \"%s\" holds less than two %llu MiB pages",
                     cfg->offload_dir, (unsigned long long)(page >> 20));
            kvp_tier_close(t);
            return KVP_ECONFIG;
        }
    }
    kvp_disk_opts o = {.dir = cfg->offload_dir,
                       .capacity = cap,
                       .page_size = page,
                       .high_watermark = cfg->offload_high,
                       .low_watermark = cfg->offload_low,
                       .staging_budget = cfg->offload_staging,
                       .on_durable = on_durable,
                       .on_dropped = on_dropped,
                       .arg = t};
    int rc = kvp_disk_open(&o, &t->disk, err, errlen);
    if (rc) {
        kvp_tier_close(t);
        return rc;
    }
    t->capacity = cap;
    kvp_disk_stats held;
    kvp_disk_get_stats(t->disk, &held);
    check_capacity(cfg, cap, held.pages * page);
    for (int i = 0; i < LOADERS; i++) {
        t->la[i] = (struct loader){t, i == 0};
        if (pthread_create(&t->th[i], NULL, loader_main, &t->la[i]) != 0) {
            snprintf(err, errlen, "cannot start the SSD tier's loader threads");
            kvp_tier_close(t);
            return KVP_EIO;
        }
        pthread_mutex_lock(&t->mu);
        t->nth++;
        pthread_mutex_unlock(&t->mu);
    }
    kvp_disk_stats ds;
    kvp_disk_get_stats(t->disk, &ds);
    KVP_INFO(MOD, "SSD tier in %s: %llu MiB, %llu records (%llu MiB) found in %llu ms, %s",
             cfg->offload_dir, (unsigned long long)(cap >> 20), (unsigned long long)ds.records,
             (unsigned long long)(ds.live_bytes >> 20), (unsigned long long)ds.scan_ms, ds.io);
    *out = t;
    return 0;
}

void kvp_tier_close(kvp_tier *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_cond_broadcast(&t->cv);
    int n = t->nth;
    pthread_mutex_unlock(&t->mu);
    for (int i = 0; i < n; i++)
        pthread_join(t->th[i], NULL);
    kvp_disk_close(t->disk); /* runs the last on_durable callbacks */
    for (job *j = t->jq_head, *nx; j; j = nx) {
        nx = j->next;
        kvp_free(j);
    }
    for (report *r = t->rq_head, *nx; r; r = nx) {
        nx = r->next;
        kvp_buf_free(&r->b);
        kvp_free(r);
    }
    if (t->evfd >= 0)
        close(t->evfd);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    kvp_free(t);
}

uint64_t kvp_tier_capacity(const kvp_tier *t) { return t->capacity; }
int kvp_tier_wake_fd(const kvp_tier *t) { return t->evfd; }

void kvp_tier_disk_stats(kvp_tier *t, kvp_disk_stats *out) { kvp_disk_get_stats(t->disk, out); }

void kvp_tier_get_stats(kvp_tier *t, kvp_tier_stats *out)
{
    pthread_mutex_lock(&t->mu);
    *out = t->st;
    pthread_mutex_unlock(&t->mu);
}
