/*
 * disk.c -- the SSD tier of a storage node; see disk.h.
 *
 * State (under d->mu): the pages (sorted by id; the last one is the open
 * page the writer appends to), the index (chained hash of entries keyed by
 * tenant + key; an entry is a live record or a tombstone, and sits on its
 * page's list), the write queue, the items being written and synced,
 * counters. The writer thread alone appends to the open page, creates and
 * seals pages and drops them for room; the syncer thread makes written
 * items durable, indexes them and runs their callbacks (see "writer"
 * below); readers hold a page reference while they read its file, so a
 * dropped page's fd is closed only once its last reader is done.
 *
 * Invariants:
 *  - an entry (live or tombstone) is indexed, and on_durable called, only
 *    once its record is durable: its write finished and then an fdatasync
 *    of its page file did; a page's index file lists only such records and
 *    is written once everything placed in the page has finished;
 *  - items are placed, submitted and completed (indexed, reported) in
 *    queue order, one FIFO (the tombstones carried out of dropped pages
 *    go to its front and have no place in the flush order), so when an
 *    item completes every item queued before it has completed, and a later
 *    write of a key replaces an earlier one;
 *  - a page with items placed in it and not finished (pending) is never
 *    dropped, compacted, nor given its index file;
 *  - page->live is the sum of the totals of the live (non-tombstone)
 *    entries on its list;
 *  - a copy of a key's record that is still in a page file but not indexed
 *    (a ghost) stays dead across a restart: the key's entry has a higher
 *    sequence (or is a tombstone of the same one) and records where ghosts
 *    may be; when the entry's record leaves while ghosts remain, a
 *    tombstone of its sequence is made durable before its page file goes.
 */
#include "node/disk.h"

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/assert.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "kvpool.h"

#define MOD "disk"
#define ALIGN KVP_DISK_ALIGN
#define PAGE_MAGIC "KVPPAGE1"
#define REC_MAGIC 0x5250564bu /* "KVPR" little-endian */
#define REC_VERSION 1u
#define READ_CHUNK (4u << 20)   /* reads: bytes per bounce buffer */

static uint64_t align_up(uint64_t v) { return (v + ALIGN - 1) & ~(uint64_t)(ALIGN - 1); }

/* ------------------------------------------------------------ records */

static void put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_u64(const uint8_t *p) { return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }

/* Header: u32 magic, u16 version, u16 flags, u32 key_len, u32 tenant_len,
 * u64 size, u64 csum, u64 seq, u64 hdr_csum (XXH3 of bytes 0..40 + key +
 * tenant), key, tenant. */
size_t kvp_disk_hdr_encode(uint8_t *p, const kvp_disk_hdr *h)
{
    size_t hl = KVP_DISK_HDR_FIXED + h->key_len + h->tenant_len;
    memset(p, 0, KVP_DISK_HDR_FIXED);
    put_u32(p, REC_MAGIC);
    put_u16(p + 4, REC_VERSION);
    put_u16(p + 6, (uint16_t)h->flags);
    put_u32(p + 8, h->key_len);
    put_u32(p + 12, h->tenant_len);
    put_u64(p + 16, h->size);
    put_u64(p + 24, h->csum);
    put_u64(p + 32, h->seq);
    memcpy(p + KVP_DISK_HDR_FIXED, h->key, h->key_len);
    memcpy(p + KVP_DISK_HDR_FIXED + h->key_len, h->tenant, h->tenant_len);
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, p, 40);
    XXH3_64bits_update(&st, p + KVP_DISK_HDR_FIXED, h->key_len + h->tenant_len);
    put_u64(p + 40, XXH3_64bits_digest(&st));
    return hl;
}

int kvp_disk_hdr_parse(const uint8_t *p, size_t len, kvp_disk_hdr *h)
{
    if (len < KVP_DISK_HDR_FIXED || get_u32(p) != REC_MAGIC ||
        (p[4] | (p[5] << 8)) != REC_VERSION)
        return -1;
    h->flags = (uint32_t)(p[6] | (p[7] << 8));
    h->key_len = get_u32(p + 8);
    h->tenant_len = get_u32(p + 12);
    h->size = get_u64(p + 16);
    h->csum = get_u64(p + 24);
    h->seq = get_u64(p + 32);
    if ((h->flags & ~KVP_DISK_TOMBSTONE) || h->key_len == 0 || h->key_len > KVP_DISK_MAX_KEY ||
        h->tenant_len > KVP_DISK_MAX_TENANT ||
        (uint64_t)KVP_DISK_HDR_FIXED + h->key_len + h->tenant_len > len ||
        ((h->flags & KVP_DISK_TOMBSTONE) && h->size) || h->size > (1ull << 40))
        return -1;
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, p, 40);
    XXH3_64bits_update(&st, p + KVP_DISK_HDR_FIXED, h->key_len + h->tenant_len);
    if (XXH3_64bits_digest(&st) != get_u64(p + 40))
        return -1;
    h->key = p + KVP_DISK_HDR_FIXED;
    h->tenant = h->key + h->key_len;
    h->hdr_len = KVP_DISK_HDR_FIXED + h->key_len + h->tenant_len;
    h->total = align_up(h->hdr_len + h->size);
    return 0;
}

/* ------------------------------------------------------------- state */

typedef struct dpage dpage;
typedef struct dent dent;

/* A page's index file in the making: the headers of its durable records. */
typedef struct idxbuf {
    uint8_t *p;
    size_t len, cap;
    uint64_t count;
} idxbuf;

/* NONE: found at open, or written; READY: sealed and its writes done, for
 * the syncer to write (held pending meanwhile) */
enum { IDX_NONE = 0, IDX_COLLECT = 1, IDX_READY = 2 };

struct dpage {
    uint64_t id;
    int fd;
    uint64_t used;     /* bytes appended, the page header included */
    uint64_t live;     /* bytes of live records */
    uint64_t last_use; /* ms: last append or read (LRU) */
    int refs;          /* readers in its file */
    int dropped;       /* gone: fd closed when refs reach 0 */
    int compacting;
    int sealed;        /* no more appends (scanned at open, or rolled past) */
    int pending;       /* items placed in it and not finished (their callbacks
                          run), and its index being written: never dropped,
                          compacted or given its index file while > 0 */
    int idx_state;
    idxbuf idx;        /* IDX_COLLECT: to be written once sealed and pending is 0 */
    uint64_t min_seq;  /* lowest record sequence in it (tombstones' reach) */
    dent *list;        /* its entries */
};

/*
 * Ghosts: copies of a key's records that are still in page files but that
 * the index does not point at (older values, records a tombstone killed,
 * the old copy of a record compaction moved, a stale compaction move). A
 * restart would see them again; what keeps them dead is the entry of the
 * key with a higher sequence (or a tombstone of the same one). So an entry
 * remembers the range of page ids that may hold ghosts of its key (glo,
 * ghi: ids + 1; 0, 0 = none), and when its own record leaves (its page
 * dropped for room, a checksum failure) while such a page is still there, a
 * tombstone of its sequence is written first (a carry): see make_room.
 */
struct dent {
    dent *hnext;            /* hash chain */
    dent *pprev, *pnext;    /* page list */
    uint64_t hash;
    dpage *page;
    uint64_t off, total, hdr_len, size, csum, seq;
    uint64_t glo, ghi;      /* ghosts */
    int tomb;
    uint32_t klen, tlen;
    uint8_t kt[];           /* key then tenant */
};

/* A page dropped for room whose file stays until the tombstones carried
 * out of it are durable. */
typedef struct zombie {
    uint64_t id;
    size_t left;            /* carries not yet finished */
    int failed;             /* one failed: the file stays (a restart scans it) */
} zombie;

/* Records of a page dropped for room, for the syncer to report. */
typedef struct droprep {
    struct droprep *next;
    kvp_disk_rec *recs;
    uint8_t *keys;
    size_t n;
} droprep;

typedef struct witem {
    struct witem *next;
    uint8_t *buf;           /* aligned record: header block(s) + value + padding;
                               given back once written (then NULL) */
    uint8_t *hb;            /* the header bytes, kept from buf once written */
    kvp_disk_hdr h;         /* h.key / h.tenant point into buf, then hb */
    void *cookie;
    uint64_t qno;           /* queue order (kvp_disk_flush); 0: a carry */
    uint64_t cap;           /* buf's capacity (buf_put) */
    int internal;           /* a compaction move or a carry (no callback) */
    int carry;              /* a tombstone carried out of a dropped record */
    zombie *zb;             /* the carry's dropped page */
    uint64_t glo, ghi;      /* ghosts the record's entry takes over */
    dpage *from;
    uint64_t from_off;
    dpage *page;            /* where it went */
    uint64_t off;
    int status;
    int written;            /* writer: its write finished (or it failed) */
} witem;

struct kvp_disk {
    kvp_disk_opts o;
    char dir[4096];
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* writer: queue, stop, syncer progress; flushers: progress */
    pthread_cond_t scv;     /* syncer: written items, or the writer done */
    dpage **pages;          /* sorted by id */
    size_t npages, cap_pages;
    uint64_t next_page_id;
    dent **ht;
    uint64_t ht_mask, count;
    witem *qhead, *qtail;   /* queued, not yet taken by the writer */
    witem *shead, *stail;   /* written, for the syncer (in queue order) */
    droprep *dhead, *dtail; /* pages dropped for room, for the syncer to report */
    uint64_t syncing;       /* items handed to the syncer, not yet finished */
    uint64_t sync_bytes;    /* ... their record bytes (at most staging_budget) */
    uint64_t queued;        /* staging bytes of items not yet written */
    uint64_t seq;           /* last record sequence given */
    uint64_t qno, done_qno; /* last item queued / completed (in order) */
    uint64_t full_until;    /* ms: the disk was full; writes refused until then */
    size_t ncompacting;     /* pages with compacting set */
    size_t nidx_ready;      /* pages with idx_state IDX_READY */
    zombie **zombies;
    size_t nzombies, cap_zombies;
    int stop, wdone;
    pthread_t writer, syncer;
    /* record buffers kept for reuse (a fresh 2 MiB buffer costs 512 page
     * faults: more than writing it), at most staging_budget bytes, under bmu */
    pthread_mutex_t bmu;
    struct {
        uint8_t *p;
        uint64_t len;
    } bcache[256];
    size_t nbcache;
    uint64_t bcache_bytes;
    uint64_t reading;       /* read buffer bytes in use */
    pthread_cond_t read_cv;
    int uring_ok, sring_ok, sring_init;
    int started, sync_started; /* the writer / syncer thread runs */
    int paused;             /* kvp_disk_pause (tests) */
    struct io_uring ring;   /* the writer's */
    struct io_uring sring;  /* the syncer's: a group's fsyncs at once */
    kvp_disk_stats st;
};

static uint64_t key_hash(const uint8_t *t, uint32_t tl, const uint8_t *k, uint32_t kl)
{
    return XXH3_64bits_withSeed(k, kl, XXH3_64bits(t, tl));
}

/* The entry of (t, k), live or tombstone, or NULL. Caller holds mu. */
static dent *find(kvp_disk *d, uint64_t h, const uint8_t *t, uint32_t tl, const uint8_t *k,
                  uint32_t kl)
{
    for (dent *e = d->ht[h & d->ht_mask]; e; e = e->hnext)
        if (e->hash == h && e->klen == kl && e->tlen == tl && !memcmp(e->kt, k, kl) &&
            !memcmp(e->kt + kl, t, tl))
            return e;
    return NULL;
}

static void ht_grow(kvp_disk *d)
{
    uint64_t nm = d->ht_mask * 2 + 1;
    dent **nt = kvp_calloc(nm + 1, sizeof *nt);
    if (!nt)
        return; /* chains just get longer */
    for (uint64_t i = 0; i <= d->ht_mask; i++)
        for (dent *e = d->ht[i], *n; e; e = n) {
            n = e->hnext;
            e->hnext = nt[e->hash & nm];
            nt[e->hash & nm] = e;
        }
    kvp_free(d->ht);
    d->ht = nt;
    d->ht_mask = nm;
}

static void page_link(dpage *p, dent *e)
{
    e->page = p;
    e->pprev = NULL;
    e->pnext = p->list;
    if (p->list)
        p->list->pprev = e;
    p->list = e;
    if (!e->tomb)
        p->live += e->total;
}

static void page_unlink(dent *e)
{
    dpage *p = e->page;
    if (e->pprev)
        e->pprev->pnext = e->pnext;
    else
        p->list = e->pnext;
    if (e->pnext)
        e->pnext->pprev = e->pprev;
    if (!e->tomb)
        p->live -= e->total;
    e->page = NULL;
}

/* Unlinks e from the index and its page and frees it. Caller holds mu. */
static void ent_del(kvp_disk *d, dent *e)
{
    dent **pp = &d->ht[e->hash & d->ht_mask];
    while (*pp != e)
        pp = &(*pp)->hnext;
    *pp = e->hnext;
    if (e->page)
        page_unlink(e);
    if (!e->tomb) {
        d->st.records--;
        d->st.live_bytes -= e->total;
    }
    d->count--;
    kvp_free(e);
}

/* ------------------------------------------------------------ ghosts */

static void ghost_add(uint64_t *lo, uint64_t *hi, uint64_t id)
{
    id++;
    if (!*lo || id < *lo)
        *lo = id;
    if (id > *hi)
        *hi = id;
}

static void ghost_merge(uint64_t *lo, uint64_t *hi, uint64_t olo, uint64_t ohi)
{
    if (ohi) {
        ghost_add(lo, hi, olo - 1);
        ghost_add(lo, hi, ohi - 1);
    }
}

/* The first index in d->pages (sorted by id) whose id is >= id. */
static size_t page_lb(const kvp_disk *d, uint64_t id)
{
    size_t a = 0, b = d->npages;
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (d->pages[m]->id < id)
            a = m + 1;
        else
            b = m;
    }
    return a;
}

/* Whether a page file other than ex's that may hold ghosts in [*lo, *hi]
 * is still there (a page, or a zombie). Narrows the range to the files
 * still there: page ids are never used again. Caller holds mu. */
static int ghosts_exist(kvp_disk *d, uint64_t *lo, uint64_t *hi, const dpage *ex)
{
    if (!*hi)
        return 0;
    uint64_t a = *lo - 1, b = *hi - 1, nlo = 0, nhi = 0;
    int any = 0;
    size_t i = page_lb(d, a), j = page_lb(d, b + 1);
    if (i < j) {
        ghost_add(&nlo, &nhi, d->pages[i]->id);
        ghost_add(&nlo, &nhi, d->pages[j - 1]->id);
        any = j - i > 1 || d->pages[i] != ex;
    }
    for (size_t k = 0; k < d->nzombies; k++)
        if (d->zombies[k]->id >= a && d->zombies[k]->id <= b) {
            ghost_add(&nlo, &nhi, d->zombies[k]->id);
            any = 1;
        }
    *lo = nlo;
    *hi = nhi;
    return any;
}

/*
 * Indexes a durable record at (p, off), taking over ghosts [glo, ghi]:
 * replaces an older entry of the key, is ignored when a newer one exists (a
 * tombstone also wins over a record of its own sequence: a carry). The copy
 * that loses stays in its page: a ghost of the winner's. Caller holds mu.
 * 1 indexed.
 */
static int ent_put(kvp_disk *d, const kvp_disk_hdr *h, dpage *p, uint64_t off, uint64_t glo,
                   uint64_t ghi)
{
    int tomb = (h->flags & KVP_DISK_TOMBSTONE) != 0;
    uint64_t hv = key_hash(h->tenant, h->tenant_len, h->key, h->key_len);
    dent *old = find(d, hv, h->tenant, h->tenant_len, h->key, h->key_len);
    if (old && (old->seq > h->seq || (old->seq == h->seq && old->tomb && !tomb))) {
        if (!tomb)
            ghost_add(&old->glo, &old->ghi, p->id);
        ghost_merge(&old->glo, &old->ghi, glo, ghi);
        return 0;
    }
    if (old && old->seq == h->seq && old->tomb == tomb) {
        /* the same record at a new place (compaction, or its copy seen in a
         * scan): the other copy stays until its page goes */
        if (!tomb)
            ghost_add(&old->glo, &old->ghi, old->page->id);
        ghost_merge(&old->glo, &old->ghi, glo, ghi);
        page_unlink(old);
        old->off = off;
        page_link(p, old);
        return 1;
    }
    dent *e = kvp_malloc(sizeof *e + h->key_len + h->tenant_len);
    if (!e)
        return 0;
    memset(e, 0, sizeof *e);
    e->hash = hv;
    e->off = off;
    e->total = h->total;
    e->hdr_len = h->hdr_len;
    e->size = h->size;
    e->csum = h->csum;
    e->seq = h->seq;
    e->tomb = tomb;
    e->klen = h->key_len;
    e->tlen = h->tenant_len;
    e->glo = glo;
    e->ghi = ghi;
    memcpy(e->kt, h->key, h->key_len);
    memcpy(e->kt + h->key_len, h->tenant, h->tenant_len);
    if (old) {
        ghost_merge(&e->glo, &e->ghi, old->glo, old->ghi);
        if (!old->tomb)
            ghost_add(&e->glo, &e->ghi, old->page->id);
        ent_del(d, old);
    }
    if (d->count + 1 > d->ht_mask + 1)
        ht_grow(d);
    e->hnext = d->ht[hv & d->ht_mask];
    d->ht[hv & d->ht_mask] = e;
    d->count++;
    page_link(p, e);
    if (!e->tomb) {
        d->st.records++;
        d->st.live_bytes += e->total;
    }
    return 1;
}

static kvp_disk_rec rec_of(const dent *e)
{
    return (kvp_disk_rec){e->kt + e->klen, e->tlen, e->kt, e->klen, e->size, e->csum, e->seq};
}

/* ------------------------------------------------------------- pages */

static void page_path(const kvp_disk *d, uint64_t id, char *out, size_t len)
{
    snprintf(out, len, "%s/kvpool-page-%016" PRIx64 ".log", d->dir, id);
}

static void idx_path(const kvp_disk *d, uint64_t id, char *out, size_t len);

static int open_flags(const kvp_disk *d) { return d->o.direct >= 0 ? O_DIRECT : 0; }

static void page_release(dpage *p)
{
    if (p->fd >= 0)
        close(p->fd);
    kvp_free(p->idx.p);
    kvp_free(p);
}

static void page_unlink_files(kvp_disk *d, uint64_t id)
{
    char path[4200];
    page_path(d, id, path, sizeof path);
    unlink(path);
    idx_path(d, id, path, sizeof path);
    unlink(path);
}

/* Drops page p (caller holds mu; p->pending is 0): its entries leave the
 * index and are returned in *recs (their key bytes copied) for on_dropped;
 * its files are deleted unless keep_files (a zombie's). */
static void page_drop(kvp_disk *d, dpage *p, kvp_disk_rec **recs, uint8_t **keys, size_t *nrec,
                      int keep_files)
{
    KVP_ASSERT(p->pending == 0);
    size_t n = 0, kb = 0;
    for (dent *e = p->list; e; e = e->pnext)
        if (!e->tomb) {
            n++;
            kb += e->klen + e->tlen;
        }
    *recs = n ? kvp_calloc(n, sizeof **recs) : NULL;
    *keys = n ? kvp_malloc(kb) : NULL;
    *nrec = 0;
    uint8_t *kp = *keys;
    while (p->list) {
        dent *e = p->list;
        if (!e->tomb && *recs && kp) {
            memcpy(kp, e->kt, e->klen + e->tlen);
            kvp_disk_rec r = rec_of(e);
            r.key = kp;
            r.tenant = kp + e->klen;
            (*recs)[(*nrec)++] = r;
            kp += e->klen + e->tlen;
        }
        ent_del(d, e);
    }
    if (!keep_files)
        page_unlink_files(d, p->id);
    for (size_t i = 0; i < d->npages; i++)
        if (d->pages[i] == p) {
            memmove(d->pages + i, d->pages + i + 1, (d->npages - i - 1) * sizeof *d->pages);
            d->npages--;
            break;
        }
    if (p->compacting)
        d->ncompacting--;
    d->st.pages = d->npages;
    d->st.used = d->npages * d->o.page_size;
    p->dropped = 1;
    if (p->refs == 0)
        page_release(p);
}

static void report_dropped(kvp_disk *d, kvp_disk_rec *recs, uint8_t *keys, size_t n)
{
    if (n && d->o.on_dropped)
        d->o.on_dropped(d->o.arg, recs, n);
    kvp_free(recs);
    kvp_free(keys);
}

static uint8_t *record_buf(kvp_disk *d, kvp_disk_hdr *h, uint64_t *cap);
static void buf_put(kvp_disk *d, uint8_t *p, uint64_t cap);

/* A tombstone of (t, k) at sequence seq that takes over ghosts [glo, ghi],
 * queued first (no callback, no place in the flush order). Caller holds
 * mu. 0, or -1 (no memory). */
static int carry(kvp_disk *d, const uint8_t *t, uint32_t tl, const uint8_t *k, uint32_t kl,
                 uint64_t seq, uint64_t glo, uint64_t ghi, zombie *zb)
{
    kvp_disk_hdr h = {KVP_DISK_TOMBSTONE, kl, tl, 0, 0, seq, k, t, 0, 0};
    uint64_t cap = 0;
    witem *w = kvp_calloc(1, sizeof *w);
    uint8_t *b = w ? record_buf(d, &h, &cap) : NULL;
    if (!b) {
        kvp_free(w);
        return -1;
    }
    w->buf = b;
    w->cap = cap;
    w->h = h;
    w->internal = 1;
    w->carry = 1;
    w->zb = zb;
    w->glo = glo;
    w->ghi = ghi;
    d->queued += h.total;
    w->next = d->qhead;
    d->qhead = w;
    if (!d->qtail)
        d->qtail = w;
    pthread_cond_broadcast(&d->cv);
    return 0;
}

/* Carries out of page v the tombstones its entries need (an entry whose
 * key has ghosts in other page files). 0 (*zb: the zombie to keep v's file
 * under, or NULL when nothing was carried), or -1 (no memory: v must stay).
 * Caller holds mu. */
static int carry_out(kvp_disk *d, dpage *v, zombie **zb)
{
    size_t n = 0;
    *zb = NULL;
    for (dent *e = v->list; e; e = e->pnext)
        n += ghosts_exist(d, &e->glo, &e->ghi, v);
    if (!n)
        return 0;
    zombie *z = kvp_calloc(1, sizeof *z);
    if (!z)
        return -1;
    if (d->nzombies == d->cap_zombies) {
        size_t nc = d->cap_zombies ? d->cap_zombies * 2 : 8;
        zombie **nz = kvp_realloc(d->zombies, nc * sizeof *nz);
        if (!nz) {
            kvp_free(z);
            return -1;
        }
        d->zombies = nz;
        d->cap_zombies = nc;
    }
    z->id = v->id;
    /* all of them or none: the queue is only touched once every one exists */
    witem *saved = d->qhead, *saved_tail = d->qtail;
    uint64_t saved_queued = d->queued;
    for (dent *e = v->list; e; e = e->pnext) {
        if (!ghosts_exist(d, &e->glo, &e->ghi, v))
            continue;
        uint64_t lo = e->glo, hi = e->ghi;
        if (!e->tomb)
            ghost_add(&lo, &hi, v->id); /* the record itself, while v's file stays */
        if (carry(d, e->kt + e->klen, e->tlen, e->kt, e->klen, e->seq, lo, hi, z) != 0) {
            while (d->qhead != saved) {
                witem *w = d->qhead;
                d->qhead = w->next;
                buf_put(d, w->buf, w->cap);
                kvp_free(w);
            }
            d->qtail = saved_tail;
            d->queued = saved_queued;
            kvp_free(z);
            return -1;
        }
        z->left++;
    }
    d->zombies[d->nzombies++] = z;
    *zb = z;
    return 0;
}

/* A carry finished: the zombie's file goes once all of its carries are
 * durable. Caller holds mu. */
static void zombie_done(kvp_disk *d, zombie *z, int failed)
{
    z->failed |= failed;
    if (--z->left)
        return;
    if (z->failed) {
        KVP_WARN_LIMITED(MOD, "page %016" PRIx64 ": a tombstone carried out of it failed: its "
                              "file stays (a restart scans it again)", z->id);
        return; /* stays a zombie: its records are still there */
    }
    page_unlink_files(d, z->id);
    for (size_t i = 0; i < d->nzombies; i++)
        if (d->zombies[i] == z) {
            d->zombies[i] = d->zombies[--d->nzombies];
            break;
        }
    kvp_free(z);
}

/* Room for one more page: drops least recently used pages (never the open
 * one, nor one with writes pending or being compacted) while more than
 * high_watermark of capacity would be used, down to low_watermark; their
 * records go to the syncer to report (on_dropped), so that a drop is
 * reported before the on_durable of any record indexed after it, on one
 * thread, as the writer alone did before the syncer. A page whose
 * entries still shadow ghosts elsewhere gets their tombstones carried into
 * the open page first; its file goes once they are durable. Writer
 * thread; caller holds mu. */
static void make_room(kvp_disk *d)
{
    double cap = (double)d->o.capacity, ps = (double)d->o.page_size;
    if ((double)(d->npages + 1) * ps <= cap * d->o.high_watermark)
        return;
    while (d->npages > 1 && (double)(d->npages + 1) * ps > cap * d->o.low_watermark) {
        dpage *v = NULL;
        for (size_t i = 0; i + 1 < d->npages; i++) { /* the last page is the open one */
            dpage *c = d->pages[i];
            if (!c->compacting && !c->pending && (!v || c->last_use < v->last_use))
                v = c;
        }
        if (!v)
            break;
        zombie *z;
        if (carry_out(d, v, &z) != 0) {
            KVP_WARN_LIMITED(MOD, "%s: out of memory for the tombstones of a page to drop: "
                                  "kept", d->dir);
            break;
        }
        kvp_disk_rec *r;
        uint8_t *k;
        size_t n;
        page_drop(d, v, &r, &k, &n, z != NULL);
        d->st.dropped_pages++;
        d->st.dropped_records += n;
        droprep *dr = n ? kvp_calloc(1, sizeof *dr) : NULL;
        if (dr) {
            dr->recs = r;
            dr->keys = k;
            dr->n = n;
            if (d->dtail)
                d->dtail->next = dr;
            else
                d->dhead = dr;
            d->dtail = dr;
            pthread_cond_signal(&d->scv);
        } else { /* nothing to report, or no memory: reported here */
            pthread_mutex_unlock(&d->mu);
            report_dropped(d, r, k, n);
            pthread_mutex_lock(&d->mu);
        }
    }
}

/* Opens page id for appending (created, its header written). */
static dpage *page_create(kvp_disk *d, uint64_t id, int *err)
{
    char path[4200];
    page_path(d, id, path, sizeof path);
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | open_flags(d), 0600);
    if (fd < 0) {
        *err = errno;
        return NULL;
    }
    if (posix_fallocate(fd, 0, (off_t)d->o.page_size) == ENOSPC) {
        close(fd);
        unlink(path);
        *err = ENOSPC;
        return NULL;
    }
    uint8_t *hb = NULL;
    if (posix_memalign((void **)&hb, ALIGN, ALIGN) != 0) {
        close(fd);
        unlink(path);
        *err = ENOMEM;
        return NULL;
    }
    memset(hb, 0, ALIGN);
    memcpy(hb, PAGE_MAGIC, 8);
    put_u64(hb + 8, id);
    put_u64(hb + 16, d->o.page_size);
    put_u64(hb + 24, XXH3_64bits(hb, 24));
    ssize_t w = pwrite(fd, hb, ALIGN, 0);
    free(hb);
    dpage *p = kvp_calloc(1, sizeof *p);
    if (w != (ssize_t)ALIGN || !p) {
        *err = w < 0 ? errno : EIO;
        close(fd);
        unlink(path);
        kvp_free(p);
        return NULL;
    }
    p->id = id;
    p->fd = fd;
    p->used = ALIGN;
    p->last_use = kvp_now_ms();
    p->idx_state = IDX_COLLECT;
    return p;
}

static int pages_add(kvp_disk *d, dpage *p)
{
    if (d->npages == d->cap_pages) {
        size_t nc = d->cap_pages ? d->cap_pages * 2 : 16;
        dpage **np = kvp_realloc(d->pages, nc * sizeof *np);
        if (!np)
            return KVP_ENOMEM;
        d->pages = np;
        d->cap_pages = nc;
    }
    d->pages[d->npages++] = p;
    d->st.pages = d->npages;
    d->st.used = d->npages * d->o.page_size;
    return 0;
}

/* ------------------------------------------------------- page indexes */

/*
 * A sealed page's index file, kvpool-page-<id>.idx: "KVPIDX01", u64 page
 * id, u64 count, then per record u64 offset + its header bytes (fixed part,
 * key, tenant), then u64 XXH3 of everything before. It lists the records
 * made durable in the page (a failed write is not listed), and is written
 * once the page is sealed and every write placed in it has finished
 * (temporary file, fdatasync, rename); a scan reads it in one go instead of
 * one header per record from the page. Missing or damaged: the page itself
 * is scanned.
 */
static void idx_add(idxbuf *b, uint64_t off, const uint8_t *hdr, size_t hlen)
{
    if (b->count == UINT64_MAX)
        return;
    if (b->len + 8 + hlen > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 65536;
        while (nc < b->len + 8 + hlen)
            nc *= 2;
        uint8_t *np = kvp_realloc(b->p, nc);
        if (!np) {
            b->count = UINT64_MAX; /* poisoned: no index file for this page */
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    put_u64(b->p + b->len, off);
    memcpy(b->p + b->len + 8, hdr, hlen);
    b->len += 8 + hlen;
    b->count++;
}

static void idx_path(const kvp_disk *d, uint64_t id, char *out, size_t len)
{
    snprintf(out, len, "%s/kvpool-page-%016" PRIx64 ".idx", d->dir, id);
}

/* Writes page id's index file under its temporary name: its fd (to be
 * made durable, then idx_finish), or -1 (nothing left behind). */
static int idx_begin(kvp_disk *d, uint64_t id, const idxbuf *b)
{
    if (b->count == UINT64_MAX)
        return -1;
    char path[4200], tmp[4210];
    idx_path(d, id, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    uint8_t head[24], tail[8];
    memcpy(head, "KVPIDX01", 8);
    put_u64(head + 8, id);
    put_u64(head + 16, b->count);
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, head, sizeof head);
    XXH3_64bits_update(&st, b->p, b->len);
    put_u64(tail, XXH3_64bits_digest(&st));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int ok = fd >= 0 && write(fd, head, sizeof head) == (ssize_t)sizeof head &&
             (b->len == 0 || write(fd, b->p, b->len) == (ssize_t)b->len) &&
             write(fd, tail, sizeof tail) == (ssize_t)sizeof tail;
    if (!ok) {
        if (fd >= 0)
            close(fd);
        unlink(tmp);
        KVP_WARN_LIMITED(MOD, "page %016" PRIx64 ": writing its index failed: a restart scans "
                              "the page instead", id);
        return -1;
    }
    return fd;
}

/* The temporary index file of page id (fd) is durable (ok) or not: renamed
 * to its name, or removed. */
static void idx_finish(kvp_disk *d, uint64_t id, int fd, int ok)
{
    char path[4200], tmp[4210];
    idx_path(d, id, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    close(fd);
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        KVP_WARN_LIMITED(MOD, "page %016" PRIx64 ": writing its index failed: a restart scans "
                              "the page instead", id);
    }
}

/* Once p is sealed and nothing placed in it is still pending, its index
 * file is for the syncer to write (with the next group's syncs): p is held
 * pending until then. Caller holds mu. */
static void idx_ready(kvp_disk *d, dpage *p)
{
    if (!p->sealed || p->pending || p->idx_state != IDX_COLLECT)
        return;
    if (!p->idx.count) { /* nothing durable in it: no index file */
        kvp_free(p->idx.p);
        memset(&p->idx, 0, sizeof p->idx);
        p->idx_state = IDX_NONE;
        return;
    }
    p->idx_state = IDX_READY;
    p->pending++;
    d->nidx_ready++;
    pthread_cond_signal(&d->scv);
}

/* ------------------------------------------------------------- writer */

/*
 * Two threads. The writer takes items off the queue in order, places them
 * in the open page and keeps io_depth writes in flight (io_uring; pwrite
 * writes them one after the other), handing the items whose writes have
 * finished, in queue order, to the syncer; it does not wait for syncs. The
 * syncer takes everything handed over so far (group commit), fdatasyncs
 * each page file written, and only then indexes the items, runs their
 * callbacks and frees them, in queue order. So while one group is being
 * made durable the next one is being written.
 */

/* Seals the open page (its index file is written once its writes have
 * finished) and opens the next one, after making room. 0 or an errno
 * (ENOSPC: no room). Caller holds mu; writer thread. */
static int roll(kvp_disk *d)
{
    dpage *cur = d->npages ? d->pages[d->npages - 1] : NULL;
    if (cur && !cur->sealed) {
        cur->sealed = 1;
        idx_ready(d, cur);
    }
    make_room(d);
    if ((d->npages + 1) * d->o.page_size > d->o.capacity)
        return ENOSPC; /* nothing could be dropped */
    int err = 0;
    uint64_t id = d->next_page_id;
    pthread_mutex_unlock(&d->mu);
    dpage *p = page_create(d, id, &err);
    pthread_mutex_lock(&d->mu);
    if (!p)
        return err ? err : EIO;
    d->next_page_id = id + 1;
    if (pages_add(d, p) != 0) {
        page_release(p);
        return ENOMEM;
    }
    return 0;
}

/* Whether anything still holds a page (writes, syncs, index files): once
 * it is done, there may be room. Caller holds mu. */
static int held(const kvp_disk *d)
{
    if (d->syncing || d->nidx_ready)
        return 1;
    for (size_t i = 0; i < d->npages; i++)
        if (d->pages[i]->pending)
            return 1;
    return 0;
}

/* Places w in the open page (rolling when it does not fit). 0 (w->status
 * set when it could not be placed), or EAGAIN: no room, but pages still
 * held (can_wait: writes in the window; or held()) may make some once
 * let go; w is not placed. Caller holds mu; writer thread. */
static int place_one(kvp_disk *d, witem *w, int can_wait)
{
    dpage *cur = d->npages ? d->pages[d->npages - 1] : NULL;
    if (!cur || cur->sealed || cur->used + w->h.total > d->o.page_size) {
        int err = roll(d);
        if (err == ENOSPC && (can_wait || held(d)))
            return EAGAIN;
        if (err) {
            w->status = err == ENOSPC ? KVP_ENO_AVAILABLE_HANDLE : KVP_EIO;
            if (err == ENOSPC)
                d->full_until = kvp_now_ms() + 500;
            KVP_WARN_LIMITED(MOD, "%s: no page for a %llu-byte record: %s", d->dir,
                             (unsigned long long)w->h.total, strerror(err));
            return 0;
        }
        cur = d->pages[d->npages - 1];
    }
    w->page = cur;
    w->off = cur->used;
    cur->pending++;
    cur->min_seq = cur->min_seq && cur->min_seq < w->h.seq ? cur->min_seq : w->h.seq;
    cur->used += w->h.total;
    cur->last_use = kvp_now_ms();
    return 0;
}

static int pwrite_all(int fd, const uint8_t *p, uint64_t len, uint64_t off)
{
    while (len) {
        ssize_t w = pwrite(fd, p, (size_t)len, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 && errno == ENOSPC ? KVP_ENO_AVAILABLE_HANDLE : KVP_EIO;
        p += w;
        len -= (uint64_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

/* w's write finished: its buffer goes back (staging is for bytes waiting
 * to be written); the header bytes stay for indexing. No lock held. */
static void written(kvp_disk *d, witem *w)
{
    w->written = 1;
    uint8_t *hb = kvp_malloc(w->h.hdr_len);
    if (!hb)
        return; /* the buffer stays until the item is finished */
    memcpy(hb, w->buf, w->h.hdr_len);
    w->hb = hb;
    w->h.key = hb + KVP_DISK_HDR_FIXED;
    w->h.tenant = w->h.key + w->h.key_len;
    buf_put(d, w->buf, w->cap);
    w->buf = NULL;
}

static void write_plain(kvp_disk *d, witem *w)
{
    w->status = pwrite_all(w->page->fd, w->buf, w->h.total, w->off);
    written(d, w);
}

/* Writes sub[0..n) (placed, in order) and waits until at least one write in
 * flight has finished: through the ring, else with pwrite. win is the
 * writer's window (every item taken and not yet handed over). No lock
 * held; writer thread. */
static void write_items(kvp_disk *d, int *uring, witem **sub, size_t n, size_t *inflight,
                        witem *win)
{
    size_t i = 0;
    if (*uring) {
        for (; i < n; i++) {
            struct io_uring_sqe *sq = io_uring_get_sqe(&d->ring);
            if (!sq)
                break;
            io_uring_prep_write(sq, sub[i]->page->fd, sub[i]->buf, (unsigned)sub[i]->h.total,
                                sub[i]->off);
            io_uring_sqe_set_data(sq, sub[i]);
        }
        int done = 0;
        while (done < (int)i) {
            int s = io_uring_submit(&d->ring);
            if (s == -EINTR)
                continue;
            if (s <= 0) {
                *uring = 0; /* what the ring took finishes below; the rest plainly */
                break;
            }
            done += s;
        }
        *inflight += (size_t)done;
        i = (size_t)done;
    }
    for (; i < n; i++)
        write_plain(d, sub[i]);
    if (!*inflight)
        return;
    struct io_uring_cqe *cq;
    int rc;
    while ((rc = io_uring_wait_cqe(&d->ring, &cq)) == -EINTR)
        ;
    if (rc != 0) {
        /* the ring failed: whatever is still in flight is written again
         * plainly (the same bytes at the same place), and the ring no
         * longer used */
        KVP_WARN_LIMITED(MOD, "%s: io_uring failed (%s): pwrite from now on", d->dir,
                         strerror(-rc));
        for (witem *w = win; w; w = w->next)
            if (!w->written)
                write_plain(d, w);
        *inflight = 0;
        *uring = 0;
        return;
    }
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&d->ring, head, cq)
    {
        witem *w = io_uring_cqe_get_data(cq);
        if (cq->res != (int)w->h.total) /* a short or failed write: write it again plainly */
            w->status = pwrite_all(w->page->fd, w->buf, w->h.total, w->off);
        written(d, w);
        seen++;
    }
    io_uring_cq_advance(&d->ring, seen);
    *inflight -= seen;
}

/* Hands the window's written prefix to the syncer. Caller holds mu. */
static void handoff(kvp_disk *d, witem **head, witem **tail)
{
    witem *first = *head, *last = NULL;
    uint64_t n = 0;
    while (*head && (*head)->written) {
        last = *head;
        *head = last->next;
        d->queued -= last->h.total; /* written: off the staging budget */
        d->sync_bytes += last->h.total;
        n++;
    }
    if (!n)
        return;
    if (!*head)
        *tail = NULL;
    last->next = NULL;
    if (d->stail)
        d->stail->next = first;
    else
        d->shead = first;
    d->stail = last;
    d->syncing += n;
    pthread_cond_signal(&d->scv);
}

#define PWRITE_ROUND (64u << 20) /* pwrite: bytes written before a hand-over */

static void *writer_main(void *arg)
{
    kvp_disk *d = arg;
    size_t depth = (size_t)d->o.io_depth;
    witem *one[1];
    witem **sub = kvp_calloc(depth, sizeof *sub);
    if (!sub) {
        sub = one;
        depth = 1;
    }
    int uring = d->uring_ok;
    size_t inflight = 0;
    witem *whead = NULL, *wtail = NULL; /* taken, not yet handed over */
    int blocked = 0; /* no room for the next item until pending writes finish */
    pthread_mutex_lock(&d->mu);
    for (;;) {
        size_t nsub = 0;
        uint64_t bytes = 0;
        if (blocked && !whead && !held(d))
            blocked = 0; /* everything let go: try once more, for good */
        while (!blocked && d->qhead && (!d->paused || d->stop) && inflight + nsub < depth &&
               (uring || bytes < PWRITE_ROUND) && d->sync_bytes < d->o.staging_budget) {
            witem *w = d->qhead;
            d->qhead = w->next;
            if (!d->qhead)
                d->qtail = NULL;
            w->next = NULL;
            if (place_one(d, w, whead != NULL) == EAGAIN) {
                w->next = d->qhead; /* back to the front */
                d->qhead = w;
                if (!d->qtail)
                    d->qtail = w;
                blocked = 1;
                break;
            }
            if (wtail)
                wtail->next = w;
            else
                whead = w;
            wtail = w;
            if (w->status || !w->page) {
                w->written = 1;
            } else {
                sub[nsub++] = w;
                bytes += w->h.total;
            }
        }
        handoff(d, &whead, &wtail);
        if (!nsub && !inflight) {
            if (d->stop && !d->qhead && !d->syncing)
                break; /* (a carry the syncer queues is written first) */
            pthread_cond_wait(&d->cv, &d->mu);
            continue;
        }
        pthread_mutex_unlock(&d->mu);
        write_items(d, &uring, sub, nsub, &inflight, whead);
        pthread_mutex_lock(&d->mu);
    }
    pthread_mutex_unlock(&d->mu);
    if (sub != one)
        kvp_free(sub);
    return NULL;
}

/* Indexes the written group g (in queue order) and counts it. Caller
 * holds mu; syncer thread. */
static void complete(kvp_disk *d, witem *g)
{
    for (witem *w = g; w; w = w->next) {
        d->sync_bytes -= w->h.total;
        if (w->status) { /* a failed move leaves the record where it is */
            d->st.write_errors++;
            if (w->status == KVP_ENO_AVAILABLE_HANDLE)
                d->full_until = kvp_now_ms() + 500; /* the disk is full: -200 for a while */
            if (w->zb)
                zombie_done(d, w->zb, 1);
            continue;
        }
        int tomb = (w->h.flags & KVP_DISK_TOMBSTONE) != 0;
        if (w->page->idx_state == IDX_COLLECT)
            idx_add(&w->page->idx, w->off, w->hb ? w->hb : w->buf, w->h.hdr_len);
        if (w->internal && !w->carry) {
            uint64_t hv = key_hash(w->h.tenant, w->h.tenant_len, w->h.key, w->h.key_len);
            dent *e = find(d, hv, w->h.tenant, w->h.tenant_len, w->h.key, w->h.key_len);
            if (e && e->seq == w->h.seq && e->page == w->from && e->off == w->from_off) {
                ent_put(d, &w->h, w->page, w->off, 0, 0); /* same record, new place */
                d->st.compacted_bytes += w->h.total;
            } else if (e && !tomb) {
                ent_put(d, &w->h, w->page, w->off, 0, 0); /* a stale copy: e's ghost */
            } else if (!tomb) {
                /* a stale copy of a key removed or dropped meanwhile: it
                 * must not come back after a restart */
                uint64_t lo = 0, hi = 0;
                ghost_add(&lo, &hi, w->page->id);
                if (carry(d, w->h.tenant, w->h.tenant_len, w->h.key, w->h.key_len, w->h.seq, lo,
                          hi, NULL) != 0)
                    KVP_WARN_LIMITED(MOD, "%s: out of memory for a tombstone", d->dir);
            }
        } else {
            ent_put(d, &w->h, w->page, w->off, w->glo, w->ghi);
            if (w->zb)
                zombie_done(d, w->zb, 0);
            if (!w->internal && !tomb) {
                d->st.writes++;
                d->st.write_bytes += w->h.size;
            }
        }
    }
    /* pages emptied by compaction go */
    for (size_t i = 0; d->ncompacting && i + 1 < d->npages; i++) {
        dpage *p = d->pages[i];
        if (p->compacting && !p->list && !p->pending) {
            kvp_disk_rec *r;
            uint8_t *k;
            size_t n;
            page_drop(d, p, &r, &k, &n, 0);
            KVP_ASSERT(n == 0);
            kvp_free(r);
            kvp_free(k);
            d->st.compacted_pages++;
            i--;
        }
    }
}

#define SRING_DEPTH 64u

/* fdatasync of fds[0..n) (failed[k] set where it failed): at once through
 * the syncer's ring (the flushes of files synced together are merged by
 * the block layer: one per group instead of one per file), else one after
 * the other. No lock held; syncer thread. */
static void sync_fds(kvp_disk *d, const int *fds, size_t n, char *failed)
{
    size_t k = 0;
    while (d->sring_ok && n - k > 1) {
        size_t m = n - k < SRING_DEPTH ? n - k : SRING_DEPTH, got = 0, prepped = 0;
        for (; prepped < m; prepped++) {
            struct io_uring_sqe *sq = io_uring_get_sqe(&d->sring);
            if (!sq)
                break;
            io_uring_prep_fsync(sq, fds[k + prepped], IORING_FSYNC_DATASYNC);
            io_uring_sqe_set_data64(sq, k + prepped);
        }
        int s;
        while ((s = io_uring_submit(&d->sring)) == -EINTR)
            ;
        if (s < 0 || (size_t)s != prepped) {
            /* (none or some taken: what was taken is waited for, the rest is
             * synced plainly, and the ring is not used again) */
            d->sring_ok = 0;
            prepped = s > 0 ? (size_t)s : 0;
        }
        memset(failed + k, 2, prepped); /* 2: in flight */
        while (got < prepped) {
            struct io_uring_cqe *cq;
            int rc = io_uring_wait_cqe(&d->sring, &cq);
            if (rc == -EINTR)
                continue;
            if (rc != 0) {
                d->sring_ok = 0;
                break;
            }
            uint64_t i = io_uring_cqe_get_data64(cq);
            failed[i] = cq->res < 0;
            if (cq->res == -EINVAL || cq->res == -EOPNOTSUPP) {
                failed[i] = 2; /* the kernel does not take it: synced plainly */
                d->sring_ok = 0;
            }
            io_uring_cqe_seen(&d->sring, cq);
            got++;
        }
        for (size_t i = k; i < k + prepped; i++)
            if (failed[i] == 2) /* the ring failed under it: synced plainly */
                failed[i] = fdatasync(fds[i]) != 0;
        k += prepped;
        if (!prepped)
            break;
    }
    for (; k < n; k++)
        failed[k] = fdatasync(fds[k]) != 0;
}

#define IDX_JOBS 16 /* index files written per group at most */

static void *syncer_main(void *arg)
{
    kvp_disk *d = arg;
    /* per group: the pages written, then the index files; their fds and
     * sync results (room for cpg pages + IDX_JOBS index files) */
    enum { PG0 = 64 };
    dpage *pg0[PG0 + IDX_JOBS], **pg = pg0;
    int fds0[PG0 + IDX_JOBS], *fds = fds0;
    char failed0[PG0 + IDX_JOBS], *failed = failed0;
    size_t cpg = PG0;
    idxbuf jb[IDX_JOBS];
    int jfd[IDX_JOBS];
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->shead && !d->nidx_ready && !d->dhead && !d->wdone)
            pthread_cond_wait(&d->scv, &d->mu);
        if (!d->shead && !d->nidx_ready && !d->dhead)
            break;
        witem *g = d->shead;
        d->shead = d->stail = NULL;
        /* the pages written, held (pending) until the group is done */
        size_t npg = 0;
        for (witem *w = g; w; w = w->next) {
            if (w->status || !w->page || (npg && pg[npg - 1] == w->page))
                continue;
            size_t k = 0;
            while (k < npg && pg[k] != w->page)
                k++;
            if (k < npg)
                continue;
            if (npg == cpg) {
                size_t nc = 2 * cpg + IDX_JOBS;
                dpage **np = kvp_malloc(nc * sizeof *np);
                int *nfd = np ? kvp_malloc(nc * sizeof *nfd) : NULL;
                char *nf = nfd ? kvp_malloc(nc) : NULL;
                if (!nf) {
                    kvp_free(np);
                    kvp_free(nfd);
                    w->status = KVP_ENOMEM; /* not claimed durable */
                    continue;
                }
                memcpy(np, pg, npg * sizeof *np);
                if (pg != pg0) {
                    kvp_free(pg);
                    kvp_free(fds);
                    kvp_free(failed);
                }
                pg = np;
                fds = nfd;
                failed = nf;
                cpg = 2 * cpg;
            }
            pg[npg++] = w->page;
            w->page->pending++;
        }
        /* index files ready (their pages already held pending) */
        size_t nj = 0;
        for (size_t i = 0; d->nidx_ready && i < d->npages && nj < IDX_JOBS; i++) {
            dpage *p = d->pages[i];
            if (p->idx_state != IDX_READY)
                continue;
            jb[nj] = p->idx;
            memset(&p->idx, 0, sizeof p->idx);
            p->idx_state = IDX_NONE;
            d->nidx_ready--;
            pg[npg + nj++] = p;
        }
        pthread_mutex_unlock(&d->mu);
        for (size_t k = 0; k < npg; k++)
            fds[k] = pg[k]->fd;
        size_t nf = npg;
        for (size_t j = 0; j < nj; j++) {
            jfd[j] = idx_begin(d, pg[npg + j]->id, &jb[j]);
            if (jfd[j] >= 0)
                fds[nf++] = jfd[j];
        }
        /* durable: one fdatasync per file for the whole group, at once */
        sync_fds(d, fds, nf, failed);
        for (size_t k = 0; k < npg; k++)
            if (failed[k])
                for (witem *w = g; w; w = w->next)
                    if (w->page == pg[k] && !w->status)
                        w->status = KVP_EIO;
        for (size_t j = 0, f = npg; j < nj; j++) {
            if (jfd[j] >= 0)
                idx_finish(d, pg[npg + j]->id, jfd[j], !failed[f++]);
            kvp_free(jb[j].p);
        }
        pthread_mutex_lock(&d->mu);
        complete(d, g);
        droprep *dl = d->dhead; /* drops before these records were indexed */
        d->dhead = d->dtail = NULL;
        pthread_mutex_unlock(&d->mu);
        for (droprep *dr = dl, *next; dr; dr = next) {
            next = dr->next;
            report_dropped(d, dr->recs, dr->keys, dr->n);
            kvp_free(dr);
        }
        for (witem *w = g; w; w = w->next)
            if (!w->internal && !(w->h.flags & KVP_DISK_TOMBSTONE) && d->o.on_durable) {
                kvp_disk_rec r = {w->h.tenant, w->h.tenant_len, w->h.key, w->h.key_len,
                                  w->h.size, w->h.csum, w->h.seq};
                d->o.on_durable(d->o.arg, &r, w->cookie, w->status);
            }
        pthread_mutex_lock(&d->mu);
        uint64_t n = 0;
        for (witem *w = g, *next; w; w = next, n++) {
            next = w->next;
            if (w->page && --w->page->pending == 0)
                idx_ready(d, w->page); /* (a page whose last pending write failed) */
            if (w->qno > d->done_qno)
                d->done_qno = w->qno; /* completed in queue order */
            buf_put(d, w->buf, w->cap);
            kvp_free(w->hb);
            kvp_free(w);
        }
        d->syncing -= n;
        for (size_t j = 0; j < nj; j++)
            pg[npg + j]->pending--; /* (their index written: they may go now) */
        for (size_t k = 0; k < npg; k++) {
            pg[k]->pending--;
            idx_ready(d, pg[k]); /* a sealed page whose writes are all done */
        }
        pthread_cond_broadcast(&d->cv);
    }
    pthread_mutex_unlock(&d->mu);
    if (pg != pg0) {
        kvp_free(pg);
        kvp_free(fds);
        kvp_free(failed);
    }
    return NULL;
}

/* ------------------------------------------------------------ writes */

/* An aligned record buffer for h (header + value room), h->hdr_len and
 * h->total set, the header encoded. NULL: ENOMEM. */
/* An aligned buffer of at least len bytes: a cached one of len..2len, else
 * a fresh one. Its capacity goes to *cap. */
static uint8_t *buf_get(kvp_disk *d, uint64_t len, uint64_t *cap)
{
    pthread_mutex_lock(&d->bmu);
    for (size_t i = 0; i < d->nbcache; i++)
        if (d->bcache[i].len >= len && d->bcache[i].len <= 2 * len) {
            uint8_t *p = d->bcache[i].p;
            *cap = d->bcache[i].len;
            d->bcache_bytes -= *cap;
            d->bcache[i] = d->bcache[--d->nbcache];
            pthread_mutex_unlock(&d->bmu);
            return p;
        }
    pthread_mutex_unlock(&d->bmu);
    uint8_t *p = NULL;
    *cap = len;
    return posix_memalign((void **)&p, ALIGN, (size_t)len) == 0 ? p : NULL;
}

static void buf_put(kvp_disk *d, uint8_t *p, uint64_t cap)
{
    if (!p)
        return;
    pthread_mutex_lock(&d->bmu);
    if (d->nbcache < sizeof d->bcache / sizeof d->bcache[0] &&
        d->bcache_bytes + cap <= d->o.staging_budget) {
        d->bcache[d->nbcache].p = p;
        d->bcache[d->nbcache++].len = cap;
        d->bcache_bytes += cap;
        p = NULL;
    }
    pthread_mutex_unlock(&d->bmu);
    free(p);
}

static uint8_t *record_buf(kvp_disk *d, kvp_disk_hdr *h, uint64_t *cap)
{
    h->hdr_len = KVP_DISK_HDR_FIXED + h->key_len + h->tenant_len;
    h->total = align_up(h->hdr_len + h->size);
    uint8_t *b = buf_get(d, h->total, cap);
    if (!b)
        return NULL;
    kvp_disk_hdr_encode(b, h);
    memset(b + h->hdr_len + h->size, 0, (size_t)(h->total - h->hdr_len - h->size)); /* padding */
    h->key = b + KVP_DISK_HDR_FIXED;
    h->tenant = h->key + h->key_len;
    return b;
}

/* Queues w (budget checked by the caller). Caller holds mu. */
static void enqueue(kvp_disk *d, witem *w)
{
    w->qno = ++d->qno;
    d->queued += w->h.total;
    if (d->qtail)
        d->qtail->next = w;
    else
        d->qhead = w;
    d->qtail = w;
    pthread_cond_broadcast(&d->cv);
}

static int check_names(uint32_t tlen, uint32_t klen)
{
    return klen == 0 || klen > KVP_DISK_MAX_KEY || tlen > KVP_DISK_MAX_TENANT ? -1 : 0;
}

int kvp_disk_write(kvp_disk *d, const uint8_t *tenant, uint32_t tlen, const uint8_t *key,
                   uint32_t klen, uint64_t csum, const struct iovec *v, int n, uint64_t size,
                   void *cookie)
{
    uint64_t tot = 0;
    for (int i = 0; i < n; i++)
        tot += v[i].iov_len;
    if (!d || check_names(tlen, klen) || n < 0 || tot != size || size == 0 ||
        size > (1ull << 40) || align_up(size + KVP_DISK_MAX_KEY + ALIGN) + ALIGN > d->o.page_size)
        return KVP_EINVALID_PARAMS;
    kvp_disk_hdr h = {0, klen, tlen, size, csum, 0, key, tenant, 0, 0};
    uint64_t need = align_up(KVP_DISK_HDR_FIXED + klen + tlen + size);
    pthread_mutex_lock(&d->mu);
    int refuse = d->stop || d->queued + need > d->o.staging_budget ||
                 kvp_now_ms() < d->full_until;
    if (refuse)
        d->st.pressure++;
    pthread_mutex_unlock(&d->mu);
    if (refuse)
        return KVP_ENO_AVAILABLE_HANDLE;
    uint64_t bcap = 0;
    uint8_t *b = record_buf(d, &h, &bcap);
    witem *w = kvp_calloc(1, sizeof *w);
    if (!b || !w) {
        buf_put(d, b, bcap);
        kvp_free(w);
        return KVP_ENOMEM;
    }
    w->cap = bcap;
    uint8_t *p = b + h.hdr_len; /* the value right after the header */
    for (int i = 0; i < n; i++) {
        memcpy(p, v[i].iov_base, v[i].iov_len);
        p += v[i].iov_len;
    }
    w->buf = b;
    w->cookie = cookie;
    pthread_mutex_lock(&d->mu);
    h.seq = ++d->seq; /* given under mu: the header is signed again with it */
    h.key = key;        /* (from the caller's bytes: encode clears the block first) */
    h.tenant = tenant;
    kvp_disk_hdr_encode(b, &h);
    h.key = b + KVP_DISK_HDR_FIXED;
    h.tenant = h.key + klen;
    w->h = h;
    enqueue(d, w);
    pthread_mutex_unlock(&d->mu);
    return 0;
}

/*
 * A tombstone for the key's live record. which == NULL: whatever record is
 * live; the tombstone takes a new sequence, so it also kills a record of
 * the key queued before it and not yet indexed (a remove of the key as of
 * now). Else only the record named (id, size, checksum), and the
 * tombstone takes that record's sequence: a record of the key queued
 * before it (a higher sequence) wins over it when indexed, and so does
 * every later one. 0, 1 (another record is live), KVP_EOBJECT_NOT_FOUND,
 * KVP_EINVALID_PARAMS, KVP_ENOMEM.
 */
typedef struct forget_which {
    uint32_t rec;
    uint64_t size, csum;
} forget_which;

static int tombstone(kvp_disk *d, const uint8_t *tenant, uint32_t tlen, const uint8_t *key,
                     uint32_t klen, const forget_which *which)
{
    if (!d || check_names(tlen, klen))
        return KVP_EINVALID_PARAMS;
    kvp_disk_hdr h = {KVP_DISK_TOMBSTONE, klen, tlen, 0, 0, 0, key, tenant, 0, 0};
    uint64_t bcap = 0;
    uint8_t *b = record_buf(d, &h, &bcap);
    witem *w = kvp_calloc(1, sizeof *w);
    if (!b || !w) {
        buf_put(d, b, bcap);
        kvp_free(w);
        return KVP_ENOMEM;
    }
    w->cap = bcap;
    uint64_t hv = key_hash(tenant, tlen, key, klen);
    pthread_mutex_lock(&d->mu);
    dent *e = find(d, hv, tenant, tlen, key, klen);
    int other = e && !e->tomb && which &&
                (kvp_disk_rec_id(e->seq) != which->rec || e->size != which->size ||
                 e->csum != which->csum);
    if (!e || e->tomb || other) {
        pthread_mutex_unlock(&d->mu);
        buf_put(d, b, bcap);
        kvp_free(w);
        return other ? 1 : KVP_EOBJECT_NOT_FOUND;
    }
    /* unreadable from now on; the tombstone (a newer seq, or the record's
     * own) keeps it so across a restart once durable, and takes over the
     * record (and its ghosts) as a ghost */
    w->glo = e->glo;
    w->ghi = e->ghi;
    ghost_add(&w->glo, &w->ghi, e->page->id);
    h.seq = which ? e->seq : ++d->seq;
    ent_del(d, e);
    h.key = key;
    h.tenant = tenant;
    kvp_disk_hdr_encode(b, &h);
    h.key = b + KVP_DISK_HDR_FIXED;
    h.tenant = h.key + klen;
    w->buf = b;
    w->h = h;
    enqueue(d, w);
    pthread_mutex_unlock(&d->mu);
    return 0;
}

int kvp_disk_remove(kvp_disk *d, const uint8_t *tenant, uint32_t tlen, const uint8_t *key,
                    uint32_t klen)
{
    return tombstone(d, tenant, tlen, key, klen, NULL);
}

int kvp_disk_forget(kvp_disk *d, const uint8_t *tenant, uint32_t tlen, const uint8_t *key,
                    uint32_t klen, uint32_t rec, uint64_t size, uint64_t csum)
{
    forget_which w = {rec, size, csum};
    return tombstone(d, tenant, tlen, key, klen, &w);
}

void kvp_disk_pause(kvp_disk *d, int on)
{
    pthread_mutex_lock(&d->mu);
    d->paused = on;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

void kvp_disk_flush(kvp_disk *d)
{
    pthread_mutex_lock(&d->mu);
    uint64_t want = d->qno;
    while (d->done_qno < want)
        pthread_cond_wait(&d->cv, &d->mu);
    pthread_mutex_unlock(&d->mu);
}

/* ------------------------------------------------------------- reads */

/* Takes n bytes of the read budget (waits for them). */
static void read_take(kvp_disk *d, uint64_t n)
{
    pthread_mutex_lock(&d->mu);
    while (d->reading && d->reading + n > d->o.read_budget)
        pthread_cond_wait(&d->read_cv, &d->mu);
    d->reading += n;
    pthread_mutex_unlock(&d->mu);
}

static void read_give(kvp_disk *d, uint64_t n)
{
    pthread_mutex_lock(&d->mu);
    d->reading -= n;
    pthread_cond_broadcast(&d->read_cv);
    pthread_mutex_unlock(&d->mu);
}

static int pread_all(int fd, uint8_t *p, uint64_t len, uint64_t off)
{
    while (len) {
        ssize_t r = pread(fd, p, (size_t)len, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return KVP_EIO;
        p += r;
        len -= (uint64_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

/*
 * Reads the value of the record at rec (hdr_len header bytes, then size
 * value bytes) through an aligned bounce buffer of at most bl bytes: the
 * reads cover whole blocks, from the block holding the value's first byte.
 * Hashes what it reads; copies it to dst unless dst is NULL. 0 or KVP_EIO.
 */
static int read_value(int fd, uint64_t rec, uint64_t hdr_len, uint64_t size, uint8_t *bb,
                      uint64_t bl, uint8_t *dst, XXH3_state_t *st)
{
    uint64_t vs = rec + hdr_len, ve = vs + size, end = align_up(ve);
    for (uint64_t cur = vs & ~(uint64_t)(ALIGN - 1); cur < end; cur += bl) {
        uint64_t n = end - cur < bl ? end - cur : bl;
        if (pread_all(fd, bb, n, cur) != 0)
            return KVP_EIO;
        uint64_t a = vs > cur ? vs - cur : 0, b = ve < cur + n ? ve - cur : n;
        XXH3_64bits_update(st, bb + a, (size_t)(b - a));
        if (dst)
            memcpy(dst + (cur + a - vs), bb + a, (size_t)(b - a));
    }
    return 0;
}

/* Page reference: the file stays open while held. */
static void page_unref(kvp_disk *d, dpage *p)
{
    pthread_mutex_lock(&d->mu);
    if (--p->refs == 0 && p->dropped)
        page_release(p);
    pthread_mutex_unlock(&d->mu);
}

int64_t kvp_disk_read(kvp_disk *d, const uint8_t *tenant, uint32_t tlen, const uint8_t *key,
                      uint32_t klen, void *dst, uint64_t cap, uint64_t *csum)
{
    if (!d || check_names(tlen, klen) || (cap && !dst))
        return KVP_EINVALID_PARAMS;
    uint64_t hv = key_hash(tenant, tlen, key, klen);
    pthread_mutex_lock(&d->mu);
    dent *e = find(d, hv, tenant, tlen, key, klen);
    if (!e || e->tomb) {
        d->st.read_misses++;
        pthread_mutex_unlock(&d->mu);
        return KVP_EOBJECT_NOT_FOUND;
    }
    dpage *p = e->page;
    uint64_t off = e->off, hl = e->hdr_len, size = e->size, want = e->csum, seq = e->seq;
    if (size > cap) {
        pthread_mutex_unlock(&d->mu);
        return KVP_EBUFFER_OVERFLOW;
    }
    p->refs++;
    p->last_use = kvp_now_ms();
    pthread_mutex_unlock(&d->mu);

    /* chunks through aligned bounce buffers, hashed as they land */
    uint64_t chunk = READ_CHUNK < d->o.read_budget ? READ_CHUNK : d->o.read_budget;
    uint64_t span = align_up(off + hl + size) - ((off + hl) & ~(uint64_t)(ALIGN - 1));
    uint64_t bl = span < chunk ? span : chunk;
    read_take(d, bl);
    uint8_t *bb = NULL;
    int rc = posix_memalign((void **)&bb, ALIGN, (size_t)bl) == 0 ? 0 : KVP_ENOMEM;
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    if (rc == 0)
        rc = read_value(p->fd, off, hl, size, bb, bl, dst, &st);
    free(bb);
    read_give(d, bl);
    page_unref(d, p);
    if (rc)
        return rc;
    if (XXH3_64bits_digest(&st) != want) {
        /* corrupt on disk: dropped, reported, never data */
        kvp_disk_rec r = {tenant, tlen, key, klen, size, want, seq};
        int dropped = 0;
        pthread_mutex_lock(&d->mu);
        d->st.corrupt++;
        dent *again = find(d, hv, tenant, tlen, key, klen);
        if (again && again->seq == seq && !again->tomb) {
            /* reported dropped: neither it nor an older copy of the key
             * comes back after a restart (a tombstone of its sequence) */
            uint64_t lo = again->glo, hi = again->ghi;
            ghost_add(&lo, &hi, again->page->id);
            if (carry(d, tenant, tlen, key, klen, seq, lo, hi, NULL) != 0)
                KVP_WARN_LIMITED(MOD, "%s: out of memory for a tombstone", d->dir);
            ent_del(d, again);
            dropped = 1;
        }
        pthread_mutex_unlock(&d->mu);
        KVP_WARN_LIMITED(MOD, "%s: a %llu-byte record failed its checksum: dropped", d->dir,
                         (unsigned long long)size);
        if (dropped && d->o.on_dropped)
            d->o.on_dropped(d->o.arg, &r, 1);
        return KVP_ECHECKSUM_MISMATCH;
    }
    pthread_mutex_lock(&d->mu);
    d->st.reads++;
    d->st.read_bytes += size;
    pthread_mutex_unlock(&d->mu);
    if (csum)
        *csum = want;
    return (int64_t)size;
}

/* -------------------------------------------------------- compaction */

uint64_t kvp_disk_tick(kvp_disk *d, uint64_t budget)
{
    if (!d || budget == 0)
        return 0;
    pthread_mutex_lock(&d->mu);
    dpage *p = NULL;
    for (size_t i = 0; i + 1 < d->npages && !p; i++)
        if (d->pages[i]->compacting && !d->pages[i]->pending)
            p = d->pages[i];
    for (size_t i = 0; i + 1 < d->npages && !p; i++) { /* more than half dead */
        dpage *c = d->pages[i];
        if (!c->pending && c->used > ALIGN && c->live * 2 < c->used - ALIGN &&
            (!p || c->live < p->live))
            p = c;
    }
    if (!p || d->queued + budget > d->o.staging_budget) {
        pthread_mutex_unlock(&d->mu);
        return 0;
    }
    /* tombstones that can kill nothing (no other page holds a record as
     * old, nor a ghost of their key) are dropped rather than moved */
    for (dent *e = p->list, *n; e; e = n) {
        n = e->pnext;
        if (!e->tomb)
            continue;
        int reach = ghosts_exist(d, &e->glo, &e->ghi, p);
        for (size_t i = 0; i < d->npages && !reach; i++)
            reach = d->pages[i] != p && d->pages[i]->min_seq && d->pages[i]->min_seq < e->seq;
        if (!reach)
            ent_del(d, e);
    }
    if (!p->list) { /* nothing left: the page goes now */
        kvp_disk_rec *r;
        uint8_t *k;
        size_t n;
        page_drop(d, p, &r, &k, &n, 0);
        kvp_free(r);
        kvp_free(k);
        d->st.compacted_pages++;
        pthread_mutex_unlock(&d->mu);
        return 0;
    }
    if (!p->compacting)
        d->ncompacting++;
    p->compacting = 1;
    /* the records to move this tick (copied: the list may change unlocked) */
    enum { MAXMOVE = 256 };
    struct {
        uint64_t off, total;
    } mv[MAXMOVE];
    size_t nm = 0;
    uint64_t bytes = 0;
    for (dent *e = p->list; e && nm < MAXMOVE && bytes < budget; e = e->pnext) {
        mv[nm].off = e->off;
        mv[nm++].total = e->total;
        bytes += e->total;
    }
    p->refs++;
    pthread_mutex_unlock(&d->mu);
    uint64_t moved = 0;
    for (size_t i = 0; i < nm; i++) {
        uint64_t bcap = 0;
        witem *w = kvp_calloc(1, sizeof *w);
        uint8_t *b = w ? buf_get(d, mv[i].total, &bcap) : NULL;
        if (!b || pread_all(p->fd, b, mv[i].total, mv[i].off) != 0 ||
            kvp_disk_hdr_parse(b, (size_t)mv[i].total, &w->h) != 0 || w->h.total != mv[i].total) {
            buf_put(d, b, bcap);
            kvp_free(w);
            continue;
        }
        w->cap = bcap;
        w->buf = b;
        w->internal = 1;
        w->from = p;
        w->from_off = mv[i].off;
        pthread_mutex_lock(&d->mu);
        enqueue(d, w);
        pthread_mutex_unlock(&d->mu);
        moved += mv[i].total;
    }
    page_unref(d, p);
    return moved;
}

/* --------------------------------------------------------- open, scan */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Records of page p from its index file: 1 used, 0 when there is none
 * usable (the page is scanned instead). */
static int scan_idx(kvp_disk *d, dpage *p)
{
    char path[4200];
    idx_path(d, p->id, path, sizeof path);
    FILE *f = fopen(path, "rbe");
    if (!f)
        return 0;
    struct stat sb;
    uint8_t *buf = NULL;
    int ok = fstat(fileno(f), &sb) == 0 && sb.st_size >= 32 && sb.st_size < (1ll << 32) &&
             (buf = kvp_malloc((size_t)sb.st_size)) != NULL &&
             fread(buf, 1, (size_t)sb.st_size, f) == (size_t)sb.st_size;
    fclose(f);
    size_t len = (size_t)sb.st_size;
    ok = ok && !memcmp(buf, "KVPIDX01", 8) && get_u64(buf + 8) == p->id &&
         XXH3_64bits(buf, len - 8) == get_u64(buf + len - 8);
    uint64_t count = ok ? get_u64(buf + 16) : 0, end = ALIGN;
    size_t pos = 24;
    for (uint64_t i = 0; ok && i < count; i++) {
        kvp_disk_hdr h;
        if (pos + 8 > len - 8 || kvp_disk_hdr_parse(buf + pos + 8, len - 8 - pos - 8, &h) != 0) {
            ok = 0;
            break;
        }
        uint64_t off = get_u64(buf + pos);
        if (off < ALIGN || off % ALIGN || off + h.total > d->o.page_size) {
            ok = 0;
            break;
        }
        ent_put(d, &h, p, off, 0, 0);
        d->st.scan_records++;
        p->min_seq = p->min_seq && p->min_seq < h.seq ? p->min_seq : h.seq;
        end = off + h.total > end ? off + h.total : end;
        pos += 8 + KVP_DISK_HDR_FIXED + h.key_len + h.tenant_len;
    }
    kvp_free(buf);
    /* (a file that passed its checksum but does not parse: what it gave
     * stays indexed -- records the page holds -- and the page is scanned
     * as well; undoing it would lose the entries, and ghosts, it replaced) */
    if (!ok)
        return 0;
    p->used = end;
    return 1;
}

/* Scans page p record by record. verify: values too (the page was open
 * when the node stopped: its tail may be torn). */
static void scan_page(kvp_disk *d, dpage *p, int verify)
{
    uint8_t *hb = NULL, *vb = NULL;
    size_t hcap = (size_t)align_up(KVP_DISK_HDR_FIXED + KVP_DISK_MAX_KEY + KVP_DISK_MAX_TENANT);
    if (posix_memalign((void **)&hb, ALIGN, hcap) != 0 ||
        posix_memalign((void **)&vb, ALIGN, READ_CHUNK) != 0) {
        free(hb);
        free(vb);
        return;
    }
    uint64_t off = ALIGN;
    while (off + ALIGN <= d->o.page_size) {
        kvp_disk_hdr h;
        if (pread_all(p->fd, hb, ALIGN, off) != 0)
            break;
        if (kvp_disk_hdr_parse(hb, ALIGN, &h) != 0) {
            /* a header longer than one block: read the rest */
            uint32_t kl = get_u32(hb + 8), tl = get_u32(hb + 12);
            if (get_u32(hb) != REC_MAGIC || kl > KVP_DISK_MAX_KEY || tl > KVP_DISK_MAX_TENANT)
                break;
            uint64_t hl = align_up(KVP_DISK_HDR_FIXED + (uint64_t)kl + tl);
            if (hl <= ALIGN || off + hl > d->o.page_size ||
                pread_all(p->fd, hb, hl, off) != 0 || kvp_disk_hdr_parse(hb, (size_t)hl, &h) != 0)
                break; /* (the header's first block is read again with the rest) */
        }
        if (off + h.total > d->o.page_size)
            break;
        if (verify && h.size) {
            XXH3_state_t st;
            XXH3_64bits_reset(&st);
            int bad = read_value(p->fd, off, h.hdr_len, h.size, vb, READ_CHUNK, NULL, &st) != 0;
            if (bad || XXH3_64bits_digest(&st) != h.csum) { /* skipped: never served */
                d->st.scan_torn++;
                KVP_WARN(MOD, "page %016" PRIx64 ": the record at %llu is torn or corrupt: "
                              "dropped", p->id, (unsigned long long)off);
                off += h.total;
                continue;
            }
        }
        ent_put(d, &h, p, off, 0, 0);
        d->st.scan_records++;
        p->min_seq = p->min_seq && p->min_seq < h.seq ? p->min_seq : h.seq;
        off += h.total;
    }
    p->used = off;
    free(hb);
    free(vb);
}

static int scan(kvp_disk *d, char *err, size_t errlen)
{
    DIR *dir = opendir(d->dir);
    if (!dir) {
        snprintf(err, errlen, "offload_dir %s: %s", d->dir, strerror(errno));
        return KVP_EIO;
    }
    uint64_t *ids = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(dir))) {
        unsigned long long id;
        char tail[8];
        if (sscanf(de->d_name, "kvpool-page-%16llx.%7s", &id, tail) != 2 || strcmp(tail, "log"))
            continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 64;
            uint64_t *ni = kvp_realloc(ids, nc * sizeof *ni);
            if (!ni)
                break;
            ids = ni;
            cap = nc;
        }
        ids[n++] = id;
    }
    closedir(dir);
    if (n)
        qsort(ids, n, sizeof *ids, cmp_u64);
    uint64_t now = kvp_now_ms();
    for (size_t i = 0; i < n; i++) {
        char path[4200];
        page_path(d, ids[i], path, sizeof path);
        int fd = open(path, O_RDONLY | O_CLOEXEC | open_flags(d));
        uint8_t *hb = NULL;
        int good = fd >= 0 && posix_memalign((void **)&hb, ALIGN, ALIGN) == 0 &&
                   pread_all(fd, hb, ALIGN, 0) == 0 && !memcmp(hb, PAGE_MAGIC, 8) &&
                   get_u64(hb + 8) == ids[i] && get_u64(hb + 16) == d->o.page_size &&
                   get_u64(hb + 24) == XXH3_64bits(hb, 24);
        free(hb);
        dpage *p = good ? kvp_calloc(1, sizeof *p) : NULL;
        if (!p || pages_add(d, p) != 0) {
            KVP_WARN(MOD, "%s: not a page of this tier (or another page size): ignored", path);
            if (fd >= 0)
                close(fd);
            kvp_free(p);
            continue;
        }
        p->id = ids[i];
        p->fd = fd;
        p->sealed = 1;
        p->last_use = now - (n - i); /* older pages are the less recently used */
        if (!scan_idx(d, p))
            scan_page(d, p, 1); /* no index: it was open when the node stopped */
        d->next_page_id = ids[i] + 1;
    }
    kvp_free(ids);
    /* tombstones that kill nothing are kept: an older copy may survive */
    return 0;
}

static void defaults(kvp_disk_opts *o)
{
    if (!o->page_size)
        o->page_size = 128u << 20;
    if (o->high_watermark <= 0)
        o->high_watermark = 0.95;
    if (o->low_watermark <= 0)
        o->low_watermark = 0.85;
    if (!o->staging_budget)
        o->staging_budget = 256u << 20;
    if (!o->read_budget)
        o->read_budget = 64u << 20;
    if (o->io_depth <= 0)
        o->io_depth = 32;
}

int kvp_disk_open(const kvp_disk_opts *opts, kvp_disk **out, char *err, size_t errlen)
{
    kvp_disk_opts o = *opts;
    defaults(&o);
    if (!o.dir || !*o.dir || strlen(o.dir) >= 4000) {
        snprintf(err, errlen, "offload_dir: a directory is required");
        return KVP_ECONFIG;
    }
    if (o.page_size < (1u << 20) || o.page_size > (1ull << 30) || o.page_size % ALIGN) {
        snprintf(err, errlen, "page size %llu: from 1 MiB to 1 GiB, a multiple of 4 KiB",
                 (unsigned long long)o.page_size);
        return KVP_ECONFIG;
    }
    if (o.capacity < 2 * o.page_size) {
        snprintf(err, errlen, "offload_capacity %llu: at least two pages (%llu bytes)",
                 (unsigned long long)o.capacity, (unsigned long long)(2 * o.page_size));
        return KVP_ECONFIG;
    }
    if (!(o.low_watermark < o.high_watermark) || o.high_watermark > 1.0) {
        snprintf(err, errlen, "disk watermarks: low %.2f must be below high %.2f (<= 1)",
                 o.low_watermark, o.high_watermark);
        return KVP_ECONFIG;
    }
    if (o.staging_budget < (4u << 20) || o.read_budget < ALIGN) {
        snprintf(err, errlen, "offload staging: at least 4 MiB");
        return KVP_ECONFIG;
    }
    if (mkdir(o.dir, 0700) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "offload_dir %s: %s", o.dir, strerror(errno));
        return KVP_EIO;
    }
    kvp_disk *d = kvp_calloc(1, sizeof *d);
    if (!d)
        return KVP_ENOMEM;
    d->o = o;
    snprintf(d->dir, sizeof d->dir, "%s", o.dir);
    d->o.dir = d->dir;
    pthread_mutex_init(&d->mu, NULL);
    pthread_mutex_init(&d->bmu, NULL);
    pthread_cond_init(&d->cv, NULL);
    pthread_cond_init(&d->scv, NULL);
    pthread_cond_init(&d->read_cv, NULL);
    d->ht_mask = 1023;
    d->ht = kvp_calloc(d->ht_mask + 1, sizeof *d->ht);
    if (!d->ht) {
        kvp_disk_close(d);
        return KVP_ENOMEM;
    }
    /* O_DIRECT where the filesystem takes it */
    if (d->o.direct >= 0) {
        char probe[4200];
        snprintf(probe, sizeof probe, "%s/.kvpool-direct-probe", d->dir);
        int fd = open(probe, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0600);
        if (fd < 0 && errno == EINVAL) {
            KVP_WARN(MOD, "%s: the filesystem refuses O_DIRECT: buffered I/O", d->dir);
            d->o.direct = -1;
        }
        if (fd >= 0)
            close(fd);
        unlink(probe);
    }
    uint64_t t0 = kvp_now_ms();
    int rc = scan(d, err, errlen);
    d->st.scan_ms = kvp_now_ms() - t0;
    if (rc) {
        kvp_disk_close(d);
        return rc;
    }
    d->uring_ok = o.io != KVP_DISK_IO_PWRITE &&
                  io_uring_queue_init((unsigned)d->o.io_depth, &d->ring, 0) == 0;
    if (!d->uring_ok && o.io == KVP_DISK_IO_URING) {
        snprintf(err, errlen, "io_uring is not available here (kernel or sandbox)");
        kvp_disk_close(d);
        return KVP_ECONFIG;
    }
    d->sring_ok = d->sring_init =
        d->uring_ok && io_uring_queue_init(SRING_DEPTH, &d->sring, 0) == 0;
    d->st.io = d->uring_ok ? "io_uring" : "pwrite";
    d->st.capacity = o.capacity;
    /* every seq after a restart is above every seq on disk */
    for (uint64_t i = 0; i <= d->ht_mask; i++)
        for (dent *e = d->ht[i]; e; e = e->hnext)
            d->seq = e->seq > d->seq ? e->seq : d->seq;
    d->seq += 1u << 20; /* records dropped by a torn scan may have had higher ones */
    if (pthread_create(&d->syncer, NULL, syncer_main, d) != 0) {
        snprintf(err, errlen, "cannot start the disk syncer thread");
        kvp_disk_close(d);
        return KVP_ENOMEM;
    }
    d->sync_started = 1;
    if (pthread_create(&d->writer, NULL, writer_main, d) != 0) {
        snprintf(err, errlen, "cannot start the disk writer thread");
        kvp_disk_close(d);
        return KVP_ENOMEM;
    }
    d->started = 1;
    KVP_INFO(MOD, "%s: %llu records in %zu pages (%llu MiB of %llu MiB) scanned in %llu ms, "
                  "%s%s", d->dir, (unsigned long long)d->st.records, d->npages,
             (unsigned long long)(d->st.live_bytes >> 20), (unsigned long long)(o.capacity >> 20),
             (unsigned long long)d->st.scan_ms, d->st.io,
             d->o.direct >= 0 ? ", O_DIRECT" : ", buffered");
    *out = d;
    return 0;
}

void kvp_disk_close(kvp_disk *d)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->mu);
    d->stop = 1;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    if (d->started)
        pthread_join(d->writer, NULL); /* it writes what is queued first, and waits
                                          for the syncer to finish it */
    pthread_mutex_lock(&d->mu);
    d->wdone = 1;
    pthread_cond_broadcast(&d->scv);
    pthread_mutex_unlock(&d->mu);
    if (d->sync_started)
        pthread_join(d->syncer, NULL);
    /* the open page's index file (a clean stop: a restart need not scan it);
     * no thread left */
    for (size_t i = 0; i < d->npages; i++) {
        dpage *p = d->pages[i];
        if (p->idx_state == IDX_COLLECT && !p->pending && p->idx.count) {
            int fd = idx_begin(d, p->id, &p->idx);
            if (fd >= 0)
                idx_finish(d, p->id, fd, fdatasync(fd) == 0);
        }
    }
    for (witem *w = d->qhead, *n; w; w = n) { /* (nothing: the writer drained it) */
        n = w->next;
        free(w->buf);
        kvp_free(w);
    }
    for (droprep *dr = d->dhead, *n; dr; dr = n) { /* (nothing: the syncer reported them) */
        n = dr->next;
        report_dropped(d, dr->recs, dr->keys, dr->n);
        kvp_free(dr);
    }
    for (size_t i = 0; i < d->nzombies; i++)
        kvp_free(d->zombies[i]);
    kvp_free(d->zombies);
    for (uint64_t i = 0; d->ht && i <= d->ht_mask; i++)
        for (dent *e = d->ht[i], *n; e; e = n) {
            n = e->hnext;
            kvp_free(e);
        }
    kvp_free(d->ht);
    for (size_t i = 0; i < d->npages; i++)
        page_release(d->pages[i]);
    kvp_free(d->pages);
    if (d->uring_ok)
        io_uring_queue_exit(&d->ring);
    if (d->sring_init)
        io_uring_queue_exit(&d->sring);
    for (size_t i = 0; i < d->nbcache; i++)
        free(d->bcache[i].p);
    pthread_mutex_destroy(&d->bmu);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
    pthread_cond_destroy(&d->scv);
    pthread_cond_destroy(&d->read_cv);
    kvp_free(d);
}

void kvp_disk_each(kvp_disk *d, void (*fn)(void *arg, const kvp_disk_rec *r), void *arg)
{
    pthread_mutex_lock(&d->mu);
    for (uint64_t i = 0; i <= d->ht_mask; i++)
        for (dent *e = d->ht[i]; e; e = e->hnext)
            if (!e->tomb) {
                kvp_disk_rec r = rec_of(e);
                fn(arg, &r);
            }
    pthread_mutex_unlock(&d->mu);
}

void kvp_disk_get_stats(kvp_disk *d, kvp_disk_stats *out)
{
    pthread_mutex_lock(&d->mu);
    *out = d->st;
    out->capacity = d->o.capacity;
    pthread_mutex_unlock(&d->mu);
}
