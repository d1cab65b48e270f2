/*
 * master.c -- the master's metadata core. See master.h for the model.
 *
 * Sections: lists / records / tenants / segments / clients / placement and
 * eviction / leases / request handlers / timers / stats and self-check.
 */
#include "master/master.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common/assert.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/secret.h"
#include "kvpool.h"
#include "master/ere.h"
#include "master/cfgtab.h"
#include "master/index.h"
#include "master/kvblk.h"
#include "master/obj.h"
#include "ha/repl.h"
#include "master/segalloc.h"
#include "net/net.h"

#define MOD "master"
#define TICK_BUDGET 4096      /* objects expired/evicted per tick and timer */
#define TICK_IDLE_MS 100      /* tick period when nothing is due */
#define PLACE_CANDIDATES 16   /* segments sampled per placement */
#define MAX_ENDPOINTS 16
#define STATS_TENANTS 1024    /* tenants one STATS answer lists at most */
#define AUTHFAIL_SLOTS 1024
#define AUTHFAIL_FREE 3            /* failed HELLOs a peer gets before backing off */
#define AUTHFAIL_MAX_MS 30000      /* longest back-off */
#define AUTHFAIL_HOLD_MS 1000      /* a failed HELLO past the free ones is answered this late */
#define DQ_MAX (4u << 20)          /* bytes of SPILL / LOAD commands queued per segment */
#define DQ_HARD (256u << 20)       /* ... of every command (FORGETs of a large remove) */
#define DQ_FRAME (1u << 20)        /* one DISK_CMD frame carries about this much */
#define SPILL_INFLIGHT ((128ull << 20) >> 12) /* pages being spilled per segment at once */
#define LOAD_SHARE 4               /* loads stage at most 1/LOAD_SHARE of a segment at once */
#define LOAD_EVICT_MAX 64          /* evictions one load may cause to find room */

typedef struct rjob rjob;

typedef struct olist {
    kvp_obj *head, *tail;
    uint64_t n;
} olist;

/*
 * A tenant's standing in the pool (slot = tenant id): its evictable
 * objects, what it holds, its limits and its weight in fair eviction. A
 * tenant "in use" holds DRAM pages; its fair share of the pool is
 * cap_pages * share / share_sum (the sum over tenants in use).
 */
typedef struct mtenant {
    olist lru;            /* its evictable objects: head = most recent use */
    olist soft;           /* its soft-pinned evictable ones, same order: victims
                             only once lru is empty */
    kvp_obj *sweep;       /* next soft-listed object the pin sweep looks at
                             (walking tail to head); NULL = from the tail */
    uint64_t pages;       /* DRAM pages its objects' replicas hold (staging loads too) */
    uint64_t bytes;       /* value bytes of its objects, every tier, pending ones too */
    uint64_t max_pages;   /* quota on pages (0 = none) */
    uint64_t max_objects; /* quota on objects (0 = none) */
    uint64_t evictions;   /* victims taken from it (dropped, spilled or DRAM copy freed) */
    uint64_t refused;     /* put keys its quota refused */
    uint32_t share;       /* fair-share weight, >= 1 */
    int32_t evpos;        /* index in m->evt while lru is not empty, else -1 */
    uint8_t configured;   /* listed in tenant_tokens_file: the slot is never released */
    uint64_t cfg_other[2]; /* objects, bytes of its configurations without a row (cfgtab.h) */
} mtenant;

struct kvp_mclient {
    uint64_t id;
    uint32_t slot;     /* index in m->clients; the writer id of pending puts */
    uint32_t nconns;
    uint32_t nseg;     /* segments it mounted */
    kvp_msess *notify; /* the session that last mounted: gets SEG_FREED */
    int node;          /* presented the node credential: may mount */
    int tcred;         /* index of its tenant credential, -1 = none */
    uint8_t session[KVP_SESSION_LEN]; /* proves the identity on more connections */
    int dropped;       /* TTL expired; freed when nconns reaches 0 */
    uint64_t last_seen;
    char name[64];
    /* its last data-path report (HEARTBEAT), by KVP_STAT_PATH(path, field) -
     * KVP_STAT_SHM_PUT_BYTES; counted in m->stats, see client_report */
    uint64_t report[KVP_STAT_NPATHS * KVP_STAT_PATH_FIELDS];
};
_Static_assert(KVP_STAT_PATH(KVP_STAT_NPATHS - 1, KVP_STAT_PATH_FIELDS - 1) ==
                   KVP_STAT__COUNT - 1,
               "the path counters are the last KVP_STAT_NPATHS x 4 of enum kvp_stat");
_Static_assert(KVP_STAT_NPATHS <= KVP_HB_MAX_PATHS, "a report can carry every path");

typedef struct kvp_mseg {
    uint64_t id;
    char *name;
    uint32_t namelen;
    uint64_t capacity;    /* bytes, multiple of 4 KiB */
    kvp_segalloc *alloc;
    uint32_t gen;         /* generation of the last allocation */
    uint32_t epoch;       /* the node's mount epoch: high half of generations */
    uint64_t used_pages;
    uint64_t lru_pages;   /* pages of replicas of evictable (LRU-listed) objects */
    uint64_t secret;      /* seeds the replica tags (kvp_replica_tag) */
    uint64_t nrep;        /* replicas stored here */
    /* freed allocations a TCP transfer could still touch that no xquar
     * record could be made for (out of memory): they stay allocated (and
     * counted in used_pages, nrep and the master's xq_pages) until the
     * segment goes */
    uint64_t held_pages, held_reps;
    kvp_mclient *owner;
    uint8_t *endpoints;   /* encoded: u32 n, then (bytes transport, bytes addr) */
    uint32_t endpoints_len;
    /* revocation notices (SEG_FREED) the node has not acknowledged, in
     * queue order: [0, nsent) sent on the current session, the rest not
     * yet; entry i has sequence number seq_head + i */
    struct notice {
        kvp_freed f;
        uint32_t ms;      /* queued at (ms32) */
        uint32_t stamp;   /* m->stamp when queued */
    } *ntc;
    uint32_t nntc, nsent, ntc_cap;
    uint64_t seq_head;
    int lost;             /* a notice could not be queued since the last re-key ... */
    uint32_t lost_ms, lost_stamp; /* ... the first such: time (ms32) and stamp */
    int going;            /* being unmounted: its node is gone */
    int dirty;            /* on m->dirty */
    int suspect;          /* a client's transfers failed here, or its owner has no
                             connection left: no placement until
                             the owner's next HEARTBEAT */
    /* SSD tier (disk_cap > 0): victims here are spilled, not dropped */
    uint64_t disk_cap;    /* bytes of the node's SSD tier */
    uint64_t disk_objs, disk_bytes; /* objects with a disk record here (ONDISK) */
    uint64_t spill_pages; /* pages of objects being spilled here */
    uint64_t load_pages;  /* pages of staging allocations being loaded here */
    uint64_t disk_usage[4]; /* the node's last USAGE: file bytes, compacted bytes,
                               compacted pages, dropped pages */
    kvp_buf dq;           /* DISK_CMD entries not yet sent, encoded */
    uint32_t dq_n;
    struct dq_cut {       /* frame boundaries in dq: entries [.., end) are n */
        size_t end;
        uint32_t n;
    } *dq_cuts;
    uint32_t ndq_cuts, dq_cuts_cap;
} kvp_mseg;

/* The staging allocation of a load whose object went away meanwhile: the
 * node may still be writing into it, so it is freed only when the node
 * reports the load done (or the segment goes). */
typedef struct quar {
    uint32_t seg, page, gen;
    uint64_t size;
} quar;

/* A freed allocation that a TCP transfer begun before the free may still
 * touch (its object's descriptors were not all dead, see exposed()): its
 * space is reused only once the node acknowledges notice `seq` (it stopped
 * every transfer on it), re-keys at a remount, or its segment goes. */
typedef struct xquar {
    uint32_t seg, page, pages;
    uint64_t seq;           /* UINT64_MAX: the notice was lost; a re-key frees it */
} xquar;

/* entries of the ring of journal times (kvp_master.jt) */
#define JT_SLOTS 128

struct kvp_master {
    kvp_config cfg;
    kvp_proto_limits lim;
    uint64_t id;
    kvp_index ix;
    kvp_index repl;       /* pending replacements (PUT_START with KVP_PUT_F_REPLACE)
                             of keys whose old object, if any, stays in ix,
                             readable, until the replacement's PUT_END */
    olist pending, leased, diskio, disk; /* the LRU lists are per tenant (mtenant) */
    uint32_t sweep_t;     /* tenant the pin sweep is on */
    kvp_mseg **segs;      /* max_segments slots, NULL = free */
    uint32_t *mounted;    /* the nseg occupied slots, in no particular order */
    uint32_t nseg;
    kvp_mclient **clients;/* max_connections slots, NULL = free */
    uint32_t client_cap;
    uint32_t nclients;
    char **tenants;       /* id -> name; 0 = "default" */
    uint16_t *tenant_len;
    uint32_t ntenants;
    uint64_t cap_pages, used_pages;
    uint64_t stats[KVP_STAT__COUNT];
    uint32_t lease_seq;
    uint64_t rng;
    uint64_t last_client_scan;
    kvp_tenant_cred *tcreds; /* tenant_tokens_file */
    size_t ntcreds;
    uint32_t *tenant_nobj;   /* objects (pending too) per tenant: one exists while > 0 */
    mtenant *tq;             /* per tenant: LRU list, use, quotas (max_tenants slots) */
    uint32_t *evt;           /* ids of the tenants with evictable objects (nevt) */
    uint32_t nevt;
    uint64_t share_sum;      /* shares of the tenants holding DRAM pages */
    uint32_t ntenants_live;
    struct authfail {        /* failed HELLOs per peer (hashed slots, overwritten) */
        uint64_t peer, until, last; /* back-off end; last failure */
        uint32_t fails;
    } authfail[AUTHFAIL_SLOTS];
    uint32_t *dirty;      /* slots of segments with frees to send */
    uint32_t ndirty;
    uint64_t freed_dropped; /* frees never told (notice buffer full, no session) */
    uint32_t nsuspect;      /* segments with `suspect` set */
    quar *quar;             /* staging allocations of gone loads (see quar) */
    uint32_t nquar, quar_cap;
    uint64_t quar_pages;
    xquar *xq;              /* see xquar */
    uint32_t nxq, xq_cap;
    uint64_t xq_pages;
    uint32_t stamp;         /* notices queued (or lost), all segments: orders them
                               (wrapping; a segment holds < 2^31 in flight) */
    uint64_t spill_total;   /* sum of the segments' spill_pages */
    uint64_t now;           /* the last handle / tick's clock */
    rjob *jobs, *jobs_tail; /* REMOVE_ALL / REMOVE_REGEX in progress, FIFO */
    /* a cluster's leader: the index stream to its standbys (ha/repl.h) */
    kvp_buf jr;             /* REPL_DATA frames not yet pushed */
    kvp_repl_wr jw;         /* writes into jr */
    uint64_t jseq;          /* seq of the last record journaled */
    /* when records were journaled: jt[(jt_head + i) % JT_SLOTS], i < jt_n,
     * oldest first, names the first seq journaled at or after its ms; the
     * records up to the next entry's seq were journaled in [ms, ms +
     * jt_step_ms). An entry opens once jt_step_ms passed since the last, so
     * the ring spans at least (JT_SLOTS - 1) * jt_step_ms >= ha_sync_timeout:
     * a record older than its oldest entry is older than that. */
    struct jtime { uint64_t seq, ms; } jt[JT_SLOTS];
    uint32_t jt_head, jt_n;
    uint64_t jt_step_ms;
    struct follower {
        kvp_msess *s;
        uint64_t acked;     /* highest seq it acknowledged */
        uint64_t mark_seq;  /* out of sync: in sync again once it acknowledged
                               this seq (the snapshot's, or the last one
                               journaled when it fell behind) */
        int in_sync;        /* a PUT_END waits for it */
        kvp_msnap *snap;    /* its snapshot, produced over turns (kvp_master_push_snaps);
                               NULL once SYNCED went out */
    } *fol;
    uint32_t nfol, fol_cap, fol_in_sync;
    /* a standby, then a new leader: the objects of the leader before it,
     * parked until the segment they live on mounts here. Parked objects'
     * replicas name their segment by index in pseg (its id); they count
     * in tenant_nobj (keeping their tenant) and nowhere else. */
    kvp_index parked;
    uint64_t *pseg;
    uint32_t npseg, pseg_cap;
    uint64_t parked_until;  /* after a takeover: what is parked then is dropped */
    /* engine KV blocks: the block index and the KV events (master/kvblk.h) */
    kvp_kvblk *kb;
    const kvp_obj *dying;   /* being destroyed: in no tier any more */
    /* published objects per configuration fingerprint in their keys (cfgtab.h) */
    kvp_cfgtab cfgs;
};

/* notices held per segment until acknowledged (32 B each); past it they are
 * lost, and what they would free waits for the node's next remount */
#define FREED_MAX (1u << 22)
/* A descriptor is honoured by the node up to its expiry + 500 ms of the
 * master's clock (node/grants.h, KVP_GRANT_SLACK_MS, the node's clock taken
 * conservatively); after XFER_MARGIN_MS more no transfer on it moves. */
#define XFER_MARGIN_MS 1000
#define FREED_PER_FRAME 256 /* entries per SEG_FREED frame (encoded from the stack) */

/* Wall-clock microseconds: where a KV event stream's seqs start. */
static uint64_t wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static inline uint32_t ms32(uint64_t now) { return (uint32_t)now; }
static inline int due(uint32_t deadline, uint64_t now) { return (int32_t)(deadline - ms32(now)) <= 0; }

static uint64_t rng_next(kvp_master *m)
{
    /* xorshift64*: placement sampling only, not security */
    m->rng ^= m->rng >> 12;
    m->rng ^= m->rng << 25;
    m->rng ^= m->rng >> 27;
    return m->rng * 0x2545F4914F6CDD1Dull;
}

/* ============================================================== lists */

static olist *list_of(kvp_master *m, kvp_obj *o)
{
    switch (o->list) {
    case KVP_LIST_PENDING: return &m->pending;
    case KVP_LIST_LEASED: return &m->leased;
    case KVP_LIST_LRU: return &m->tq[o->tenant].lru;
    case KVP_LIST_SOFT: return &m->tq[o->tenant].soft;
    case KVP_LIST_DISKIO: return &m->diskio;
    case KVP_LIST_DISK: return &m->disk;
    }
    return NULL;
}

/* The tenants with evictable objects, for victim selection: a tenant joins
 * when its LRU list gets its first object and leaves when it empties. */
static void evt_join(kvp_master *m, uint32_t t)
{
    KVP_ASSERT(m->tq[t].evpos < 0 && m->nevt < m->cfg.max_tenants);
    m->tq[t].evpos = (int32_t)m->nevt;
    m->evt[m->nevt++] = t;
}

static void evt_leave(kvp_master *m, uint32_t t)
{
    int32_t k = m->tq[t].evpos;
    KVP_ASSERT(k >= 0 && (uint32_t)k < m->nevt && m->evt[k] == t);
    m->evt[k] = m->evt[--m->nevt];
    m->tq[m->evt[k]].evpos = k;
    m->tq[t].evpos = -1;
}

/* A tenant's DRAM use changes by `reps` replicas of o (+ allocated, -
 * freed); share_sum follows the tenants that start or stop holding pages.
 * Called wherever an object's nrep changes. */
static void tenant_pages(kvp_master *m, const kvp_obj *o, int reps)
{
    mtenant *t = &m->tq[o->tenant];
    uint64_t np = (uint64_t)kvp_pages(o->size) * (uint64_t)(reps < 0 ? -reps : reps);
    if (np == 0)
        return;
    if (reps > 0) {
        if (t->pages == 0)
            m->share_sum += t->share;
        t->pages += np;
        return;
    }
    KVP_ASSERT(t->pages >= np);
    t->pages -= np;
    if (t->pages == 0) {
        KVP_ASSERT(m->share_sum >= t->share);
        m->share_sum -= t->share;
    }
}

/* Keeps each segment's count of evictable pages: +/- when an object
 * enters or leaves the LRU list. */
static void lru_account(kvp_master *m, kvp_obj *o, int sign)
{
    kvp_orep *r = kvp_obj_reps(o);
    uint64_t np = kvp_pages(o->size);
    for (unsigned i = 0; i < o->nrep; i++) {
        if (sign > 0) {
            m->segs[r[i].seg]->lru_pages += np;
        } else {
            KVP_ASSERT(m->segs[r[i].seg]->lru_pages >= np);
            m->segs[r[i].seg]->lru_pages -= np;
        }
    }
}

static void list_unlink(kvp_master *m, kvp_obj *o)
{
    olist *l = list_of(m, o);
    if (!l)
        return;
    KVP_ASSERT(l->n > 0);
    KVP_ASSERT(o->prev ? o->prev->next == o : l->head == o);
    KVP_ASSERT(o->next ? o->next->prev == o : l->tail == o);
    if (o->list == KVP_LIST_LRU || o->list == KVP_LIST_SOFT)
        lru_account(m, o, -1);
    if (o->list == KVP_LIST_SOFT && m->tq[o->tenant].sweep == o)
        m->tq[o->tenant].sweep = o->prev;
    if (o->prev) o->prev->next = o->next; else l->head = o->next;
    if (o->next) o->next->prev = o->prev; else l->tail = o->prev;
    o->prev = o->next = NULL;
    int was = o->list;
    o->list = KVP_LIST_NONE;
    l->n--;
    if (was == KVP_LIST_LRU && l->n == 0)
        evt_leave(m, o->tenant);
}

/* Every object is on exactly one list (master.h), the one its state says:
 * pending = PENDING, leased = COMPLETE with leases, lru = COMPLETE,
 * unleased, unpinned; soft = the same, soft-pinned. */
static void list_check_push(const kvp_obj *o, int which)
{
    KVP_ASSERT(o->list == KVP_LIST_NONE && !o->prev && !o->next);
    KVP_ASSERT(which != KVP_LIST_PENDING || o->state == KVP_OBJ_PENDING);
    KVP_ASSERT(which != KVP_LIST_LEASED || (o->state == KVP_OBJ_COMPLETE && o->aux > 0));
    KVP_ASSERT(which != KVP_LIST_LRU || (o->state == KVP_OBJ_COMPLETE && o->aux == 0 &&
                                         !(o->flags & KVP_OBJ_PINNED) && o->nrep > 0 &&
                                         !o->softpin));
    KVP_ASSERT(which != KVP_LIST_SOFT || (o->state == KVP_OBJ_COMPLETE && o->aux == 0 &&
                                          !(o->flags & KVP_OBJ_PINNED) && o->nrep > 0 &&
                                          o->softpin));
    KVP_ASSERT(which != KVP_LIST_DISKIO ||
               (o->state == KVP_OBJ_COMPLETE && o->aux == 0 &&
                (o->flags & (KVP_OBJ_SPILLING | KVP_OBJ_LOADING))));
    KVP_ASSERT(which != KVP_LIST_DISK || (o->state == KVP_OBJ_COMPLETE && o->aux == 0 &&
                                          o->nrep == 0 && (o->flags & KVP_OBJ_ONDISK)));
}

static void list_push_tail(kvp_master *m, int which, kvp_obj *o)
{
    list_check_push(o, which);
    if (which == KVP_LIST_LRU || which == KVP_LIST_SOFT)
        lru_account(m, o, +1);
    o->list = (uint8_t)which;
    olist *l = list_of(m, o);
    o->next = NULL;
    o->prev = l->tail;
    if (l->tail) l->tail->next = o; else l->head = o;
    l->tail = o;
    if (l->n++ == 0 && which == KVP_LIST_LRU)
        evt_join(m, o->tenant);
}

static void list_push_head(kvp_master *m, int which, kvp_obj *o)
{
    list_check_push(o, which);
    if (which == KVP_LIST_LRU || which == KVP_LIST_SOFT)
        lru_account(m, o, +1);
    o->list = (uint8_t)which;
    olist *l = list_of(m, o);
    o->prev = NULL;
    o->next = l->head;
    if (l->head) l->head->prev = o; else l->tail = o;
    l->head = o;
    if (l->n++ == 0 && which == KVP_LIST_LRU)
        evt_join(m, o->tenant);
}

/*
 * A COMPLETE object's read leases live in o->aux (pending: the writer's
 * slot): the low LEASE_BITS count them (KVP_STAT_LEASES is their sum), the
 * high bits count how many of them are lookup holds -- leases EXIST_LEASE
 * granted that no GET has taken over yet (holds <= count, so aux == 0
 * still means "no lease"). Every lease of an object ends at o->deadline,
 * lease_ttl after the latest one granted (lease_expire_all: the whole
 * epoch), or one by one by RELEASE.
 *
 * A GET of an object with a hold takes it over: its lease is that count
 * instead of one more. So a lookup followed by its load's GET and RELEASE
 * leaves nothing pinning the object (without the take-over it would stay
 * unevictable for lease_ttl after the load: in a pool at capacity that
 * turns LRU eviction into "evict what was just stored"). Each lookup adds
 * its own hold, so while every GET follows its own requester's lookup (the
 * vLLM connector), there are at least as many holds as lookups still
 * waiting for their GET: none loses its protection to another's GET. A
 * GET without a lookup before it (a plain client) may take over someone
 * else's hold; a hold no GET takes over ends with the epoch.
 */
#define LEASE_BITS 24
#define LEASE_MAX ((1u << LEASE_BITS) - 1)
#define HOLD_MAX (UINT32_MAX >> LEASE_BITS)
static uint32_t lease_count(const kvp_obj *o) { return o->aux & LEASE_MAX; }
static uint32_t lease_holds(const kvp_obj *o) { return o->aux >> LEASE_BITS; }
static void lease_set(kvp_obj *o, uint32_t count, uint32_t holds)
{
    KVP_ASSERT(count <= LEASE_MAX && holds <= HOLD_MAX && holds <= count);
    o->aux = holds << LEASE_BITS | count;
}

/* The list an unleased COMPLETE object belongs on (master.h). */
static int unleased_list(const kvp_obj *o)
{
    if (o->flags & (KVP_OBJ_SPILLING | KVP_OBJ_LOADING))
        return KVP_LIST_DISKIO;
    if (o->nrep == 0)
        return KVP_LIST_DISK;
    if (o->flags & KVP_OBJ_PINNED)
        return KVP_LIST_NONE;
    return o->softpin ? KVP_LIST_SOFT : KVP_LIST_LRU;
}

/*
 * Soft pins (obj.h): pin_until is the first KVP_PIN_TICK_MS tick at which
 * the pin is over, in 24 wrapping bits. A pending put keeps its TTL in
 * ticks (rounded up); from PUT_END the pin ends strictly after now + TTL
 * and at most two ticks (32 ms) later. Checked lazily: when the object is
 * settled, by the sweep (pin_sweep), and when it is replaced.
 */
static uint32_t pin_tick(uint64_t ms) { return (uint32_t)(ms / KVP_PIN_TICK_MS) & KVP_PIN_KEEP; }

static uint32_t pin_ticks(uint64_t ttl_ms) /* a TTL in ticks, rounded up */
{
    return (uint32_t)((ttl_ms + KVP_PIN_TICK_MS - 1) / KVP_PIN_TICK_MS);
}

static void pin_set(kvp_obj *o, uint64_t now, uint32_t ticks)
{
    o->pin_until = (pin_tick(now + (uint64_t)ticks * KVP_PIN_TICK_MS) + 1) & KVP_PIN_KEEP;
}

static int pin_over(const kvp_obj *o, uint64_t now)
{
    uint32_t left = ((uint32_t)o->pin_until - pin_tick(now)) & KVP_PIN_KEEP;
    return left == 0 || left >= (1u << (KVP_PIN_BITS - 1));
}

/* Puts a COMPLETE object with no lease where it belongs: LRU (or soft)
 * head (most recently used) unless hard-pinned; waiting on its node; only
 * on disk. A soft pin that is over ends here. */
static void settle_unleased(kvp_master *m, kvp_obj *o)
{
    if (o->softpin && pin_over(o, m->now))
        o->softpin = 0;
    int which = unleased_list(o);
    if (which == KVP_LIST_DISKIO) /* the node gets put_timeout to answer */
        o->deadline = ms32(m->now + m->cfg.put_timeout_ms);
    if (which == KVP_LIST_DISK || which == KVP_LIST_DISKIO)
        list_push_tail(m, which, o);
    else if (which == KVP_LIST_LRU || which == KVP_LIST_SOFT)
        list_push_head(m, which, o);
}

static void tenant_release_if_empty(kvp_master *m, int id);
static int used_seg(const kvp_orep *reps, unsigned n, uint32_t seg);
static int may_mount(const kvp_master *m, const kvp_mclient *c);

/* ============================================================ records */

/* A published object enters (+1) or leaves (-1) the count of its key's
 * configuration (cfgtab.h); called wherever KVP_STAT_OBJECTS moves. */
static void cfg_count(kvp_master *m, const kvp_obj *o, int delta)
{
    kvp_cfgtab_count(&m->cfgs, o->tenant, kvp_obj_key(o), o->keylen, o->size, delta,
                     m->tq[o->tenant].cfg_other);
}

static inline uint64_t wire_gen(const kvp_mseg *s, uint32_t gen)
{
    return (uint64_t)s->epoch << 32 | gen;
}

static void journal_pub(kvp_master *m, kvp_obj *o);
static void journal_del(kvp_master *m, kvp_obj *o);
static void blk_sync(kvp_master *m, kvp_obj *o);
static void adopt_parked(kvp_master *m, uint32_t si);

/* a is later than b (ms32, wrapping) */
static inline int after(uint32_t a, uint32_t b) { return (int32_t)(a - b) > 0; }

static void seg_dirty(kvp_master *m, kvp_mseg *s, uint32_t si)
{
    if (!s->dirty) {
        s->dirty = 1;
        m->dirty[m->ndirty++] = si;
    }
}

/*
 * Queues a revocation notice (SEG_FREED) for the segment's node: freed (the
 * allocation's descriptors stop working at once rather than at their
 * expiry) or published (its WRITE descriptors do). Returns the notice's
 * sequence number, or UINT64_MAX when it could not be queued (no session
 * to tell, FREED_MAX queued, no memory): counted, and remembered in
 * lost / lost_ms until the node re-keys.
 */
static uint64_t note_freed(kvp_master *m, kvp_mseg *s, uint32_t si, uint32_t page, uint32_t np,
                           uint32_t gen, uint32_t flags)
{
    if (!s->owner || !s->owner->notify || s->nntc >= FREED_MAX)
        goto lost;
    if (s->nntc == s->ntc_cap) {
        uint32_t cap = s->ntc_cap ? s->ntc_cap * 2 : 64;
        struct notice *f = kvp_realloc(s->ntc, cap * sizeof *f);
        if (!f)
            goto lost;
        s->ntc = f;
        s->ntc_cap = cap;
    }
    s->ntc[s->nntc++] =
        (struct notice){{page, np, wire_gen(s, gen), flags}, ms32(m->now), ++m->stamp};
    seg_dirty(m, s, si);
    return s->seq_head + s->nntc - 1;
lost:
    m->freed_dropped++;
    ++m->stamp;
    if (!s->lost) {
        s->lost = 1;
        s->lost_ms = ms32(m->now);
        s->lost_stamp = m->stamp;
    }
    return UINT64_MAX;
}

/*
 * Whether a TCP transfer begun before now may still touch a replica on s
 * of object o (see xquar). Every descriptor of o is dead at the node, and
 * every transfer on it stopped, once
 *   - its WRITE descriptors are: a pending object's expire at o->exposed
 *     (the put deadline); a complete one's were revoked by the notices
 *     PUT_END queued (o->exposed is their stamp), applied once every
 *     notice queued up to them is acknowledged with none lost since;
 *   - and its READ descriptors are (KVP_OBJ_READ; o->exposed is then the
 *     latest expiry, later than the publication): expired XFER_MARGIN_MS
 *     before now; the publication's notices are then older than any queued
 *     after that expiry.
 * A false "exposed" only delays reuse by a node round trip.
 */
static int exposed(const kvp_master *m, const kvp_mseg *s, const kvp_obj *o)
{
    if (s->going)
        return 0; /* the node is gone, and with it its transfers */
    if (o->state != KVP_OBJ_COMPLETE)
        return !due(o->exposed + XFER_MARGIN_MS, m->now);
    if (o->flags & KVP_OBJ_READ) {
        if (!due(o->exposed + XFER_MARGIN_MS, m->now))
            return 1;
        if (s->lost && !after(s->lost_ms, o->exposed))
            return 1;
        return s->nntc > 0 && !after(s->ntc[0].ms, o->exposed);
    }
    if (s->lost && !after(s->lost_stamp, o->exposed))
        return 1;
    return s->nntc > 0 && !after(s->ntc[0].stamp, o->exposed);
}

/* Returns np pages at `page` to si's allocator. */
static void space_free(kvp_master *m, uint32_t si, uint32_t page, uint32_t np)
{
    kvp_mseg *s = m->segs[si];
    KVP_ASSERT(s->used_pages >= np && s->nrep > 0 && m->used_pages >= np);
    kvp_segalloc_free(s->alloc, page, np);
    s->used_pages -= np;
    s->nrep--;
    m->used_pages -= np;
}

/* Remembers a freed allocation until its notice is acknowledged (xquar);
 * its pages stay allocated and counted (xq_pages). Without memory to
 * remember it the pages stay allocated until the segment goes (held_*). */
static void xquarantine(kvp_master *m, uint32_t si, uint32_t page, uint32_t np, uint64_t seq)
{
    if (m->nxq == m->xq_cap) {
        uint32_t cap = m->xq_cap ? m->xq_cap * 2 : 16;
        xquar *q = kvp_realloc(m->xq, cap * sizeof *q);
        if (!q) {
            KVP_WARN(MOD, "out of memory: %u pages held until their segment goes", np);
            m->segs[si]->held_pages += np;
            m->segs[si]->held_reps++;
            m->xq_pages += np;
            return;
        }
        m->xq = q;
        m->xq_cap = cap;
    }
    m->xq[m->nxq++] = (xquar){si, page, np, seq};
    m->xq_pages += np;
}

/* Frees the quarantined allocations of segment slot si with a notice up
 * to seq acknowledged (UINT64_MAX: all of them). */
static void xq_release(kvp_master *m, uint32_t si, uint64_t seq)
{
    for (uint32_t i = 0; i < m->nxq;) {
        xquar q = m->xq[i];
        if (q.seg != si || (q.seq > seq && seq != UINT64_MAX)) {
            i++;
            continue;
        }
        m->xq[i] = m->xq[--m->nxq];
        m->xq_pages -= q.pages;
        space_free(m, si, q.page, q.pages);
    }
}

static void free_replica(kvp_master *m, const kvp_obj *o, const kvp_orep *r)
{
    kvp_mseg *s = m->segs[r->seg];
    uint32_t np = kvp_pages(o->size);
    KVP_ASSERT(s->used_pages >= np && s->nrep > 0 && m->used_pages >= np);
    int hold = exposed(m, s, o);
    uint64_t seq = s->going ? UINT64_MAX : note_freed(m, s, r->seg, r->page, np, r->gen, 0);
    if (hold)
        xquarantine(m, r->seg, r->page, np, seq);
    else
        space_free(m, r->seg, r->page, np);
}

/* A replica's space that no descriptor ever named (an undone placement, a
 * staging copy the node fills itself): freed at once. */
static void free_unexposed(kvp_master *m, const kvp_orep *r, uint64_t size)
{
    kvp_mseg *s = m->segs[r->seg];
    uint32_t np = kvp_pages(size);
    if (!s->going)
        note_freed(m, s, r->seg, r->page, np, r->gen, 0);
    space_free(m, r->seg, r->page, np);
}

enum { GONE_REMOVED, GONE_EVICTED, GONE_REVOKED, GONE_TIMEOUT };

static void disk_cmd(kvp_master *m, uint32_t si, uint8_t what, const kvp_obj *o, uint32_t page,
                     uint64_t gen);
static void disk_forget(kvp_master *m, kvp_obj *o);
static void quarantine(kvp_master *m, const kvp_obj *o, const kvp_orep *r);

/* Removes an object entirely: list, replicas, index, record; and its disk
 * record (FORGET), or what it has in flight there. */
static void obj_destroy(kvp_master *m, kvp_obj *o, int why)
{
    KVP_ASSERT(o->nrep <= o->rep_cap);
    KVP_ASSERT(m->tenant_nobj[o->tenant] > 0 && m->tq[o->tenant].bytes >= o->size);
    journal_del(m, o);
    if (o->blk) {
        m->dying = o; /* the disk record's FORGET below is no tier move */
        kvp_kvblk_remove(m->kb, o);
    }
    list_unlink(m, o);
    tenant_pages(m, o, -(int)o->nrep);
    m->tq[o->tenant].bytes -= o->size;
    kvp_orep *r = kvp_obj_reps(o);
    if (o->flags & KVP_OBJ_SPILLING) {
        kvp_mseg *ds = m->segs[o->disk_seg];
        KVP_ASSERT(ds->spill_pages >= kvp_pages(o->size) && m->stats[KVP_STAT_SPILLING] > 0);
        ds->spill_pages -= kvp_pages(o->size);
        m->spill_total -= kvp_pages(o->size);
        m->stats[KVP_STAT_SPILLING]--;
        /* the record, when it lands, is reported for an object no longer
         * spilling: the answer to that report forgets it */
    }
    if (o->flags & KVP_OBJ_ONDISK)
        disk_forget(m, o);
    if (o->flags & KVP_OBJ_LOADING) {
        KVP_ASSERT(o->nrep == 1 && r[0].seg == o->disk_seg);
        kvp_mseg *ds = m->segs[o->disk_seg];
        KVP_ASSERT(ds->load_pages >= kvp_pages(o->size));
        ds->load_pages -= kvp_pages(o->size);
        quarantine(m, o, &r[0]); /* the node may still be writing it */
    } else {
        for (unsigned i = 0; i < o->nrep; i++)
            free_replica(m, o, &r[i]);
    }
    kvp_index_remove(o->replacing ? &m->repl : &m->ix, o);
    m->tenant_nobj[o->tenant]--;
    tenant_release_if_empty(m, o->tenant);
    if (o->state == KVP_OBJ_COMPLETE) {
        KVP_ASSERT(m->stats[KVP_STAT_OBJECTS] > 0 && m->stats[KVP_STAT_BYTES] >= o->size &&
                   m->stats[KVP_STAT_LEASES] >= lease_count(o));
        m->stats[KVP_STAT_OBJECTS]--;
        m->stats[KVP_STAT_BYTES] -= o->size;
        m->stats[KVP_STAT_LEASES] -= lease_count(o);
        cfg_count(m, o, -1);
    } else {
        KVP_ASSERT(m->stats[KVP_STAT_PENDING] > 0);
        m->stats[KVP_STAT_PENDING]--;
    }
    if (why == GONE_EVICTED) {
        m->stats[KVP_STAT_EVICTIONS]++;
        m->stats[KVP_STAT_EVICTED_BYTES] += o->size;
    } else if (why == GONE_REVOKED) {
        m->stats[KVP_STAT_PUT_REVOKED]++;
    } else if (why == GONE_TIMEOUT) {
        m->stats[KVP_STAT_PUT_TIMEOUTS]++;
    }
    m->dying = NULL;
    kvp_sfree(o, kvp_obj_size(o));
}

/* ============================================================ tenants */

/*
 * Tenants: id -> name, ids reused. A tenant exists while it holds an
 * object (pending ones count): PUT_STARTs that store nothing leave no
 * tenant behind, so naming new tenants cannot fill the table. "default"
 * (id 0) and the tenants of tenant_tokens_file (with their quotas and
 * shares) always exist.
 */

/* Tenant id of a name; -1 if unknown. Empty name = "default" (id 0). */
static int tenant_find(const kvp_master *m, kvp_bytes t)
{
    if (t.len == 0)
        return 0;
    for (uint32_t i = 0; i < m->ntenants; i++)
        if (m->tenants[i] && m->tenant_len[i] == t.len && memcmp(m->tenants[i], t.p, t.len) == 0)
            return (int)i;
    return -1;
}

/* A fresh slot: no quota, share 1. */
static void tenant_reset(mtenant *t)
{
    memset(t, 0, sizeof *t);
    t->share = 1;
    t->evpos = -1;
}

/* Tenant id, created if new. KVP_ELIMIT / KVP_ENOMEM / KVP_EINVALID_PARAMS. */
static int tenant_get(kvp_master *m, kvp_bytes t)
{
    int id = tenant_find(m, t);
    if (id >= 0)
        return id;
    if (t.len > 255 || memchr(t.p, 0, t.len))
        return KVP_EINVALID_PARAMS;
    if (m->ntenants_live >= m->cfg.max_tenants)
        return KVP_ELIMIT;
    uint32_t slot;
    for (slot = 1; slot < m->ntenants && m->tenants[slot]; slot++)
        ;
    char *n = kvp_strndup((const char *)t.p, t.len);
    if (!n)
        return KVP_ENOMEM;
    m->tenants[slot] = n;
    m->tenant_len[slot] = (uint16_t)t.len;
    m->tenant_nobj[slot] = 0;
    tenant_reset(&m->tq[slot]);
    m->ntenants_live++;
    if (slot == m->ntenants)
        m->ntenants++;
    return (int)slot;
}

/* Frees a tenant that holds nothing (never "default" nor a configured one). */
static void tenant_release_if_empty(kvp_master *m, int id)
{
    if (id <= 0 || m->tenant_nobj[id] > 0 || !m->tenants[id] || m->tq[id].configured)
        return;
    KVP_ASSERT(m->tq[id].pages == 0 && m->tq[id].bytes == 0 && m->tq[id].lru.n == 0);
    KVP_ASSERT(m->tq[id].cfg_other[0] == 0 && m->tq[id].cfg_other[1] == 0);
    KVP_ASSERT(m->ntenants_live > 0);
    if (m->kb)
        kvp_kvblk_tenant_gone(m->kb, (uint16_t)id);
    kvp_free(m->tenants[id]);
    m->tenants[id] = NULL;
    m->tenant_len[id] = 0;
    m->ntenants_live--;
}

/*
 * May this session name tenant t? Without tenant credentials, yes. With
 * them, a tenant listed in the table only with its token, and a session
 * holding a tenant's token only that tenant. KVP_EILLEGAL_CLIENT if not.
 */
static int tenant_allowed(const kvp_master *m, const kvp_mclient *c, kvp_bytes t)
{
    if (m->ntcreds == 0)
        return 0;
    static const char def[] = "default";
    if (t.len == 0) {
        t.p = (const uint8_t *)def;
        t.len = sizeof def - 1;
    }
    if (c->tcred >= 0) {
        const char *own = m->tcreds[c->tcred].tenant;
        return strlen(own) == t.len && !memcmp(own, t.p, t.len) ? 0 : KVP_EILLEGAL_CLIENT;
    }
    for (size_t i = 0; i < m->ntcreds; i++)
        if (strlen(m->tcreds[i].tenant) == t.len && !memcmp(m->tcreds[i].tenant, t.p, t.len))
            return KVP_EILLEGAL_CLIENT;
    return 0;
}

/* =========================================================== segments */

static int seg_find_id(const kvp_master *m, uint64_t id)
{
    for (uint32_t k = 0; k < m->nseg; k++)
        if (m->segs[m->mounted[k]]->id == id)
            return (int)m->mounted[k];
    return -1;
}

static int seg_find_name(const kvp_master *m, kvp_bytes name)
{
    if (name.len == 0)
        return -1;
    for (uint32_t k = 0; k < m->nseg; k++) {
        const kvp_mseg *s = m->segs[m->mounted[k]];
        if (s->namelen == name.len && memcmp(s->name, name.p, name.len) == 0)
            return (int)m->mounted[k];
    }
    return -1;
}

static void seg_free(kvp_mseg *s)
{
    kvp_buf_free(&s->dq);
    kvp_free(s->dq_cuts);
    kvp_free(s->ntc);
    kvp_segalloc_destroy(s->alloc);
    kvp_free(s->name);
    kvp_free(s->endpoints);
    kvp_free(s);
}

/*
 * Unmounts segment slot `si`: every replica there is dropped; objects left
 * with no replica are removed (pending ones count as revoked). Cost: one
 * pass over the index, O(objects): unmounts are rare (node leave/death).
 */
static void seg_unmount(kvp_master *m, uint32_t si)
{
    kvp_mseg *s = m->segs[si];
    uint64_t dropped = 0;
    s->going = 1;
    xq_release(m, si, UINT64_MAX);
    /* the held ones: the allocator goes with the segment */
    KVP_ASSERT(s->used_pages >= s->held_pages && s->nrep >= s->held_reps &&
               m->used_pages >= s->held_pages && m->xq_pages >= s->held_pages);
    s->used_pages -= s->held_pages;
    s->nrep -= s->held_reps;
    m->used_pages -= s->held_pages;
    m->xq_pages -= s->held_pages;
    s->held_pages = s->held_reps = 0;
    for (uint32_t i = 0; i < m->nquar;) { /* the node is gone: nothing writes there */
        if (m->quar[i].seg == si) {
            quar q = m->quar[i];
            m->quar[i] = m->quar[--m->nquar];
            kvp_orep r = {q.seg, q.page, q.gen};
            m->quar_pages -= kvp_pages(q.size);
            free_unexposed(m, &r, q.size);
        } else {
            i++;
        }
    }
    /* pending replacements with a replica here are revoked (the old
     * objects, in the index, are handled below like any other) */
    kvp_index_settle(&m->repl);
    for (uint64_t i = 0; m->repl.count && i <= m->repl.mask; i++) {
        kvp_obj *o = kvp_index_at(&m->repl, i);
        if (o && used_seg(kvp_obj_reps(o), o->nrep, si)) {
            dropped++;
            obj_destroy(m, o, GONE_REVOKED);
            i--; /* backward shift may have moved an unvisited entry here */
        }
    }
    kvp_index_settle(&m->ix);
    for (uint64_t i = 0; (s->nrep > 0 || s->disk_objs > 0 || s->spill_pages > 0) &&
                         i <= m->ix.mask;
         i++) {
        kvp_obj *o = kvp_index_at(&m->ix, i);
        if (!o)
            continue;
        if ((o->flags & (KVP_OBJ_ONDISK | KVP_OBJ_SPILLING | KVP_OBJ_LOADING)) &&
            o->disk_seg == si) {
            /* its disk record goes with the node: what DRAM holds stays */
            int loading = (o->flags & KVP_OBJ_LOADING) != 0;
            list_unlink(m, o);
            if (o->flags & KVP_OBJ_ONDISK) {
                KVP_ASSERT(s->disk_objs > 0 && s->disk_bytes >= o->size);
                s->disk_objs--;
                s->disk_bytes -= o->size;
                m->stats[KVP_STAT_DISK_OBJECTS]--;
                m->stats[KVP_STAT_DISK_BYTES] -= o->size;
            }
            if (o->flags & KVP_OBJ_SPILLING) {
                s->spill_pages -= kvp_pages(o->size);
                m->spill_total -= kvp_pages(o->size);
                m->stats[KVP_STAT_SPILLING]--;
            }
            if (loading)
                s->load_pages -= kvp_pages(o->size);
            o->flags &= (uint8_t)~(KVP_OBJ_ONDISK | KVP_OBJ_SPILLING | KVP_OBJ_LOADING);
            if (o->nrep == 0 || loading) { /* a staging copy is not readable */
                dropped++;
                obj_destroy(m, o, GONE_REMOVED);
                i--;
                continue;
            }
            if (o->aux == 0)
                settle_unleased(m, o);
            else
                list_push_tail(m, KVP_LIST_LEASED, o);
        }
        kvp_orep *r = kvp_obj_reps(o);
        unsigned k;
        for (k = 0; k < o->nrep && r[k].seg != si; k++)
            ;
        if (k == o->nrep)
            continue;
        dropped++;
        if (o->state == KVP_OBJ_PENDING || o->nrep == 1) {
            obj_destroy(m, o, o->state == KVP_OBJ_PENDING ? GONE_REVOKED : GONE_REMOVED);
            i--; /* backward shift may have moved an unvisited entry here */
            continue;
        }
        KVP_ASSERT(o->nrep > 1 && o->state == KVP_OBJ_COMPLETE);
        if (o->list == KVP_LIST_LRU || o->list == KVP_LIST_SOFT) {
            KVP_ASSERT(s->lru_pages >= kvp_pages(o->size));
            s->lru_pages -= kvp_pages(o->size);
        }
        free_replica(m, o, &r[k]);
        tenant_pages(m, o, -1);
        memmove(&r[k], &r[k + 1], (o->nrep - k - 1) * sizeof *r);
        o->nrep--;
        journal_pub(m, o);
    }
    KVP_ASSERT(s->nrep == 0 && s->disk_objs == 0 && s->spill_pages == 0 && s->load_pages == 0);
    KVP_ASSERT(m->cap_pages >= s->capacity >> 12 && m->nseg > 0);
    m->cap_pages -= s->capacity >> 12;
    m->stats[KVP_STAT_DISK_CAPACITY] -= s->disk_cap;
    if (s->suspect) {
        KVP_ASSERT(m->nsuspect > 0);
        m->nsuspect--;
    }
    if (s->dirty) /* the node re-mounts with a new epoch: nothing to tell it */
        for (uint32_t i = 0; i < m->ndirty; i++)
            if (m->dirty[i] == si) {
                m->dirty[i] = m->dirty[--m->ndirty];
                break;
            }
    m->segs[si] = NULL;
    for (uint32_t i = 0; i < m->nseg; i++)
        if (m->mounted[i] == si) {
            m->mounted[i] = m->mounted[m->nseg - 1];
            break;
        }
    m->nseg--;
    if (s->owner) {
        KVP_ASSERT(s->owner->nseg > 0);
        s->owner->nseg--;
    }
    KVP_INFO(MOD, "segment %016llx (%s) unmounted, %llu replicas dropped",
             (unsigned long long)s->id, s->name, (unsigned long long)dropped);
    seg_free(s);
}

/* An endpoint a client could use: "tcp" or "ucx" HOST:PORT (port
 * 1..65535; ucx is set up over that tcp endpoint) or "shm"
 * HOSTID:/absolute/socket/path that fits a sockaddr_un. */
static int endpoint_ok(const kvp_endpoint *e)
{
    char a[300];
    if (e->addr.len == 0 || e->addr.len >= sizeof a || memchr(e->addr.p, 0, e->addr.len))
        return 0;
    memcpy(a, e->addr.p, e->addr.len);
    a[e->addr.len] = 0;
    if (e->transport.len == 3 &&
        (!memcmp(e->transport.p, "tcp", 3) || !memcmp(e->transport.p, "ucx", 3))) {
        char host[256];
        uint16_t port;
        return kvp_net_split(a, host, sizeof host, &port) == 0 && host[0] && port != 0;
    }
    if (e->transport.len == 3 && !memcmp(e->transport.p, "shm", 3)) {
        const char *path = strchr(a, ':');
        return path && path > a && path[1] == '/' && strlen(path + 1) < 108;
    }
    return 0; /* a transport this master does not know */
}

/* Is the node that mounted s gone: no connection left (its process died),
 * or silent for half the client TTL (it heartbeats every third)? Its
 * segment stays until the TTL, but a restarted node may take its place. */
static int owner_gone(const kvp_master *m, const kvp_mseg *s)
{
    const kvp_mclient *c = s->owner;
    return !c || c->nconns == 0 || m->now - c->last_seen > m->cfg.client_ttl_ms / 2;
}

/*
 * A remount by the segment's owner. A new secret means the node re-keyed
 * and cut every transfer in flight before mounting (node.c link_fence):
 * every descriptor issued before is dead, so the quarantined space is free
 * and the unacknowledged notices are moot. The same secret: the notices not
 * acknowledged go again on the new session.
 */
static void seg_rekeyed(kvp_master *m, uint32_t si, uint64_t secret)
{
    kvp_mseg *s = m->segs[si];
    if (s->secret == secret) {
        s->nsent = 0;
        if (s->nntc)
            seg_dirty(m, s, si);
        return;
    }
    s->secret = secret;
    s->seq_head += s->nntc;
    s->nntc = s->nsent = 0;
    s->lost = 0;
    xq_release(m, si, UINT64_MAX);
}

/* A segment offering "ucx" while tenants are protected: its remote key
 * would give every cluster-token holder every tenant's bytes (SECURITY.md,
 * "UCX remote keys"); refused unless ucx_insecure. The node then refuses
 * to start and never answers UCX_ATTACH (it opens that only once a master
 * accepted its mount). */
static int ucx_refused(const kvp_master *m, const kvp_seg_desc *d)
{
    if (m->ntcreds == 0 || m->cfg.ucx_insecure)
        return 0;
    for (uint32_t i = 0; i < d->n_endpoints; i++)
        if (d->endpoints[i].transport.len == 3 && !memcmp(d->endpoints[i].transport.p, "ucx", 3))
            return 1;
    return 0;
}

static int seg_mount(kvp_master *m, kvp_mclient *c, const kvp_seg_desc *d)
{
    for (uint32_t i = 0; i < d->n_endpoints; i++)
        if (!endpoint_ok(&d->endpoints[i]))
            return KVP_EINVALID_PARAMS;
    if (d->id == 0 || d->name.len == 0 || d->name.len > 255 || memchr(d->name.p, 0, d->name.len))
        return KVP_EINVALID_PARAMS;
    if (ucx_refused(m, d)) {
        KVP_WARN_LIMITED(MOD, "segment %016llx refused: it offers the ucx transport while "
                              "tenant_tokens_file protects tenants (key \"ucx_insecure\")",
                         (unsigned long long)d->id);
        return KVP_ENOT_SUPPORTED;
    }
    uint64_t cap = d->capacity & ~(uint64_t)4095;
    if (cap < 4096 || (cap >> 12) > UINT32_MAX || d->n_endpoints > MAX_ENDPOINTS)
        return KVP_EINVALID_PARAMS;
    int si = seg_find_id(m, d->id);
    if (si >= 0) {
        kvp_mseg *s = m->segs[si];
        if (s->owner != c)
            return KVP_ESEGMENT_ALREADY_EXISTS;
        if (s->capacity != cap)
            return KVP_EINVALID_PARAMS;
        seg_rekeyed(m, (uint32_t)si, d->secret);
        return 0; /* remount by its owner: idempotent */
    }
    int old = seg_find_name(m, d->name);
    if (old >= 0) {
        /* the name is the node's HOST:PORT, which a restarted node listens
         * on again within its old session's TTL: it takes the name back --
         * but only from a node that is gone (no connection left, or silent
         * for half the TTL). A live node keeps its name: another mounter
         * (a plain client where anyone may mount) cannot replace it and so
         * drop its objects. */
        if (m->segs[old]->owner == c || !may_mount(m, c) || !owner_gone(m, m->segs[old])) {
            KVP_WARN_LIMITED(MOD, "MOUNT_SEGMENT of %016llx refused: segment %016llx of a live "
                                  "node already has the name %s",
                             (unsigned long long)d->id, (unsigned long long)m->segs[old]->id,
                             m->segs[old]->name);
            return KVP_ESEGMENT_ALREADY_EXISTS;
        }
        KVP_INFO(MOD, "segment %016llx (%s) replaced by %016llx: its node restarted",
                 (unsigned long long)m->segs[old]->id, m->segs[old]->name,
                 (unsigned long long)d->id);
        seg_unmount(m, (uint32_t)old);
    }
    uint32_t slot;
    for (slot = 0; slot < m->cfg.max_segments && m->segs[slot]; slot++)
        ;
    if (slot == m->cfg.max_segments)
        return KVP_ELIMIT;
    kvp_mseg *s = kvp_calloc(1, sizeof *s);
    if (!s)
        return KVP_ENOMEM;
    kvp_buf_init(&s->dq, DQ_HARD);
    kvp_buf eb;
    kvp_buf_init(&eb, 64 * 1024);
    kvp_buf_u32(&eb, d->n_endpoints);
    for (uint32_t i = 0; i < d->n_endpoints; i++) {
        kvp_buf_bytes(&eb, d->endpoints[i].transport.p, d->endpoints[i].transport.len);
        kvp_buf_bytes(&eb, d->endpoints[i].addr.p, d->endpoints[i].addr.len);
    }
    s->id = d->id;
    s->name = kvp_strndup((const char *)d->name.p, d->name.len);
    s->namelen = d->name.len;
    s->capacity = cap;
    s->secret = d->secret;
    s->seq_head = 1;
    s->epoch = d->epoch;
    s->disk_cap = d->disk_capacity;
    s->owner = c;
    s->endpoints = eb.data;
    s->endpoints_len = (uint32_t)eb.len;
    int rc = eb.err ? eb.err : (s->name ? 0 : KVP_ENOMEM);
    if (rc == 0)
        rc = kvp_segalloc_create((uint32_t)(cap >> 12), &s->alloc);
    if (rc) {
        seg_free(s);
        return rc;
    }
    m->segs[slot] = s;
    m->mounted[m->nseg++] = slot;
    m->cap_pages += cap >> 12;
    c->nseg++;
    m->stats[KVP_STAT_DISK_CAPACITY] += s->disk_cap;
    KVP_INFO(MOD, "segment %016llx (%s, %llu MiB, SSD tier %llu MiB) mounted by client %016llx",
             (unsigned long long)s->id, s->name, (unsigned long long)(cap >> 20),
             (unsigned long long)(s->disk_cap >> 20), (unsigned long long)c->id);
    adopt_parked(m, slot);
    return 0;
}

/* ============================================================ clients */

static kvp_mclient *client_find(kvp_master *m, uint64_t id)
{
    for (uint32_t i = 0; i < m->client_cap; i++)
        if (m->clients[i] && m->clients[i]->id == id && !m->clients[i]->dropped)
            return m->clients[i];
    return NULL;
}

static int client_new(kvp_master *m, uint64_t id, kvp_bytes name, uint64_t now, kvp_mclient **out)
{
    uint32_t slot;
    for (slot = 0; slot < m->client_cap && m->clients[slot]; slot++)
        ;
    if (slot == m->client_cap)
        return KVP_ELIMIT;
    kvp_mclient *c = kvp_calloc(1, sizeof *c);
    if (!c)
        return KVP_ENOMEM;
    c->id = id;
    c->slot = slot;
    c->last_seen = now;
    size_t n = name.len < sizeof c->name - 1 ? name.len : sizeof c->name - 1;
    for (size_t i = 0; i < n; i++) /* printable only: it goes to logs */
        c->name[i] = (name.p[i] >= 32 && name.p[i] < 127) ? (char)name.p[i] : '?';
    m->clients[slot] = c;
    m->nclients++;
    *out = c;
    return 0;
}

static void client_free(kvp_master *m, kvp_mclient *c)
{
    KVP_ASSERT(m->clients[c->slot] == c && c->nconns == 0);
    m->clients[c->slot] = NULL;
    if (!c->dropped) {
        KVP_ASSERT(m->nclients > 0);
        m->nclients--;
    }
    kvp_free(c);
}

/* Revokes every pending put written by client slot `slot`. O(pending). */
static void revoke_pending_of(kvp_master *m, uint32_t slot)
{
    kvp_obj *o = m->pending.head;
    while (o) {
        kvp_obj *next = o->next;
        if (o->aux == slot)
            obj_destroy(m, o, GONE_REVOKED);
        o = next;
    }
}

/* Liveness: the client was silent for client_ttl. Its segments are
 * unmounted, its pending puts revoked; its leases have expired already
 * (lease_ttl <= client_ttl is enforced by the config). */
static void client_drop(kvp_master *m, kvp_mclient *c)
{
    KVP_WARN(MOD, "client %016llx (%s) silent for %llu ms: dropped, %u segment(s) unmounted",
             (unsigned long long)c->id, c->name, (unsigned long long)m->cfg.client_ttl_ms, c->nseg);
    for (uint32_t i = 0; i < m->cfg.max_segments && c->nseg; i++)
        if (m->segs[i] && m->segs[i]->owner == c)
            seg_unmount(m, i);
    revoke_pending_of(m, c->slot);
    KVP_ASSERT(!c->dropped && m->nclients > 0);
    c->dropped = 1;
    m->nclients--;
    m->stats[KVP_STAT_CLIENTS_EXPIRED]++;
    if (c->nconns == 0)
        client_free(m, c);
}

/* ================================================ placement, eviction */

/* ========================================================== SSD tier */

/* Queues one DISK_CMD entry for segment slot si's node (sent by
 * kvp_master_push_freed). Callers of SPILL and LOAD checked disk_can_send. */
static void disk_cmd_ent(kvp_master *m, uint32_t si, const kvp_disk_ent *ent)
{
    kvp_mseg *s = m->segs[si];
    kvp_disk_ent e = *ent;
    size_t mark = s->dq.len;
    kvp_enc_disk_ent(&s->dq, &e);
    if (s->dq.err) { /* only FORGET gets here unchecked: the record stays, unlisted */
        s->dq.err = 0;
        s->dq.len = mark;
        m->freed_dropped++;
        return;
    }
    s->dq_n++;
    size_t last = s->ndq_cuts ? s->dq_cuts[s->ndq_cuts - 1].end : 0;
    if (s->dq.len - last >= DQ_FRAME) { /* close a frame's worth */
        if (s->ndq_cuts == s->dq_cuts_cap) {
            uint32_t cap = s->dq_cuts_cap ? s->dq_cuts_cap * 2 : 8;
            struct dq_cut *c = kvp_realloc(s->dq_cuts, cap * sizeof *c);
            if (c) {
                s->dq_cuts = c;
                s->dq_cuts_cap = cap;
            }
        }
        if (s->ndq_cuts < s->dq_cuts_cap) {
            uint32_t before = 0;
            for (uint32_t i = 0; i < s->ndq_cuts; i++)
                before += s->dq_cuts[i].n;
            s->dq_cuts[s->ndq_cuts++] = (struct dq_cut){s->dq.len, s->dq_n - before};
        }
    }
    if (!s->dirty) {
        s->dirty = 1;
        m->dirty[m->ndirty++] = si;
    }
}

static void disk_cmd(kvp_master *m, uint32_t si, uint8_t what, const kvp_obj *o, uint32_t page,
                     uint64_t gen)
{
    const char *t = m->tenants[o->tenant];
    kvp_disk_ent e = {what, 0, {(const uint8_t *)t, m->tenant_len[o->tenant]},
                      {kvp_obj_key(o), o->keylen}, o->size, o->checksum, page, gen,
                      what == KVP_DISK_FORGET ? o->disk_rec : 0};
    disk_cmd_ent(m, si, &e);
}

/* Can a command reach si's node now (a session, room in its queue)? */
static int disk_can_send(const kvp_master *m, uint32_t si)
{
    const kvp_mseg *s = m->segs[si];
    return s->disk_cap && s->owner && s->owner->notify && s->dq.len + 4096 + 2 * 65536 < DQ_MAX;
}

static void disk_unadopt(kvp_master *m, kvp_obj *o)
{
    KVP_ASSERT(o->flags & KVP_OBJ_ONDISK);
    kvp_mseg *s = m->segs[o->disk_seg];
    KVP_ASSERT(s->disk_objs > 0 && s->disk_bytes >= o->size);
    s->disk_objs--;
    s->disk_bytes -= o->size;
    m->stats[KVP_STAT_DISK_OBJECTS]--;
    m->stats[KVP_STAT_DISK_BYTES] -= o->size;
    o->flags &= (uint8_t)~KVP_OBJ_ONDISK;
    blk_sync(m, o);
}

/* The object's disk record is no longer wanted: ONDISK cleared, counts
 * adjusted, the node told to remove it (when it can be told): that record
 * (disk_rec), so a FORGET that reaches the node late never removes a newer
 * record of the key. */
static void disk_forget(kvp_master *m, kvp_obj *o)
{
    uint32_t si = o->disk_seg;
    disk_unadopt(m, o);
    if (m->segs[si]->owner && m->segs[si]->owner->notify)
        disk_cmd(m, si, KVP_DISK_FORGET, o, 0, 0);
}

/* o's value is record rec on slot si's node. */
static void disk_adopt(kvp_master *m, kvp_obj *o, uint32_t si, uint32_t rec)
{
    kvp_mseg *s = m->segs[si];
    KVP_ASSERT(si < UINT16_MAX);
    o->flags |= KVP_OBJ_ONDISK;
    o->disk_seg = (uint16_t)si;
    o->disk_rec = rec;
    s->disk_objs++;
    s->disk_bytes += o->size;
    m->stats[KVP_STAT_DISK_OBJECTS]++;
    m->stats[KVP_STAT_DISK_BYTES] += o->size;
    blk_sync(m, o);
}

/* Never allocates: quar_reserve made room when the load started. */
static void quarantine(kvp_master *m, const kvp_obj *o, const kvp_orep *r)
{
    if (KVP_NEVER(m->nquar >= m->quar_cap))
        return;
    m->quar[m->nquar++] = (quar){r->seg, r->page, r->gen, o->size};
    m->quar_pages += kvp_pages(o->size);
}

/* Frees every DRAM replica of an object that has a disk record; it stays
 * visible, served from disk. */
static void drop_dram(kvp_master *m, kvp_obj *o)
{
    KVP_ASSERT((o->flags & KVP_OBJ_ONDISK) && !(o->flags & KVP_OBJ_LOADING) && o->aux == 0);
    list_unlink(m, o);
    kvp_orep *r = kvp_obj_reps(o);
    for (unsigned i = 0; i < o->nrep; i++)
        free_replica(m, o, &r[i]);
    tenant_pages(m, o, -(int)o->nrep);
    o->nrep = 0;
    settle_unleased(m, o);
    journal_del(m, o);
}

/* Starts writing o (an LRU victim) to disk from its replica k: 1 started,
 * 0 that segment has no reachable SSD tier, -1 the tier is busy (enough
 * being spilled there already: the caller waits for it). */
static int spill_start(kvp_master *m, kvp_obj *o, unsigned k)
{
    kvp_orep *r = &kvp_obj_reps(o)[k];
    kvp_mseg *s = m->segs[r->seg];
    if (!s->disk_cap)
        return 0;
    if (!disk_can_send(m, r->seg))
        return s->owner && s->owner->notify ? -1 : 0;
    if (s->spill_pages >= SPILL_INFLIGHT)
        return -1;
    disk_cmd(m, r->seg, KVP_DISK_SPILL, o, r->page, wire_gen(s, r->gen));
    list_unlink(m, o);
    o->flags |= KVP_OBJ_SPILLING;
    o->disk_seg = (uint16_t)r->seg;
    s->spill_pages += kvp_pages(o->size);
    m->spill_total += kvp_pages(o->size);
    m->stats[KVP_STAT_SPILLING]++;
    settle_unleased(m, o);
    return 1;
}

/*
 * Fair eviction: which tenant gives the next victim. A tenant at or over
 * its fair share of `factor` x the pool (cap_pages * factor * share /
 * share_sum, counting `who` as in use) gives first, the most over (pages
 * per share) first; else `who`'s own objects (the tenant making room; -1
 * for background eviction). So a tenant within its share is never evicted
 * for another tenant's flood: the flooder evicts its own objects, or is
 * answered -200 once it has nothing evictable. Cost: O(tenants with
 * evictable objects) per victim, O(1) with one tenant. -1 = no victim.
 */
/* Pages per share at or over which a tenant gives victims (`who` counted
 * as in use). */
static double fair_room(const kvp_master *m, int who, double factor)
{
    uint64_t sum = m->share_sum;
    if (who >= 0 && m->tq[who].pages == 0)
        sum += m->tq[who].share;
    return factor * (double)m->cap_pages / (double)(sum ? sum : 1);
}

static int victim_tenant(const kvp_master *m, int who, double factor)
{
    double room = fair_room(m, who, factor);
    int best = -1;
    double best_r = -1;
    for (uint32_t k = 0; k < m->nevt; k++) {
        const mtenant *t = &m->tq[m->evt[k]];
        double r = (double)t->pages / (double)t->share; /* pages per share */
        if (r >= room && r > best_r) {
            best = (int)m->evt[k];
            best_r = r;
        }
    }
    if (best < 0 && who >= 0 && m->tq[who].lru.n > 0)
        best = who;
    return best;
}

/* victim_tenant's rule over the soft lists (the tenants are scanned: this
 * runs only once no tenant gives an unpinned victim). */
static int victim_tenant_soft(const kvp_master *m, int who, double factor)
{
    double room = fair_room(m, who, factor);
    int best = -1;
    double best_r = -1;
    for (uint32_t t = 0; t < m->ntenants; t++) {
        const mtenant *tq = &m->tq[t];
        double r = (double)tq->pages / (double)tq->share;
        if (tq->soft.n > 0 && r >= room && r > best_r) {
            best = (int)t;
            best_r = r;
        }
    }
    if (best < 0 && who >= 0 && m->tq[who].soft.n > 0)
        best = who;
    return best;
}

/*
 * The next object to evict for tenant `who` (-1: background), NULL when
 * none: the least recently used unpinned object of the tenant victim_tenant
 * names; when there is none and `soft`, the least recently used
 * soft-pinned one by the same rule. So a tenant's soft-pinned objects go
 * only after all its unpinned ones, and background eviction (soft = 0)
 * never takes them: they give way only to a put or load that needs room.
 */
static kvp_obj *victim(kvp_master *m, int who, double factor, int soft)
{
    int t = victim_tenant(m, who, factor);
    if (t >= 0)
        return m->tq[t].lru.tail;
    if (!soft || (t = victim_tenant_soft(m, who, factor)) < 0)
        return NULL;
    return m->tq[t].soft.tail;
}

/* Tenant t's own next victim (its quotas): unpinned first, then soft-pinned. */
static kvp_obj *own_victim(kvp_master *m, int t)
{
    return m->tq[t].lru.tail ? m->tq[t].lru.tail : m->tq[t].soft.tail;
}

/*
 * Evicts o, an evictable object (NULL: none, answers -1; see victim). With
 * `spill`, a victim
 * on a segment with an SSD tier is written there instead of being dropped
 * (it frees its DRAM once durable), and one that already has a disk record
 * only loses its DRAM copy; without, the victim is removed (limits on the
 * object count and metadata memory). Returns the number of segment slots it
 * freed space on (in freed), 0 when a spill started (space comes later), or
 * -1 when nothing is evictable now.
 */
static int evict_one(kvp_master *m, kvp_obj *o, uint32_t freed[KVP_MAX_REPLICAS], int spill)
{
    if (!o)
        return -1;
    int t = o->tenant;
    /* the LRU and soft lists hold exactly the evictable objects (master.h) */
    KVP_ASSERT((o->list == KVP_LIST_LRU || o->list == KVP_LIST_SOFT) &&
               o->state == KVP_OBJ_COMPLETE && o->aux == 0 &&
               !(o->flags & (KVP_OBJ_PINNED | KVP_OBJ_SPILLING | KVP_OBJ_LOADING)));
    unsigned n = o->nrep;
    kvp_orep *r = kvp_obj_reps(o);
    if (spill && !(o->flags & KVP_OBJ_ONDISK)) {
        for (unsigned i = 0; i < n; i++) {
            int st = spill_start(m, o, i);
            if (st > 0)
                m->tq[t].evictions++;
            if (st)
                return st > 0 ? 0 : -1;
        }
    }
    m->tq[t].evictions++;
    for (unsigned i = 0; i < n; i++)
        freed[i] = r[i].seg;
    if (spill && (o->flags & KVP_OBJ_ONDISK))
        drop_dram(m, o);
    else
        obj_destroy(m, o, GONE_EVICTED);
    return (int)n;
}

static int used_seg(const kvp_orep *reps, unsigned n, uint32_t seg)
{
    for (unsigned i = 0; i < n; i++)
        if (reps[i].seg == seg)
            return 1;
    return 0;
}

/* Placement avoids a segment reported failing while some other segment is
 * not: with every segment suspect (one node, a transient error) puts still
 * go somewhere and find out. */
static int avoid(const kvp_master *m, const kvp_mseg *s)
{
    return s->suspect && m->nsuspect < m->nseg;
}

static int try_alloc(kvp_master *m, uint32_t si, uint32_t np, kvp_orep *out)
{
    kvp_mseg *s = m->segs[si];
    if (avoid(m, s))
        return KVP_ENO_AVAILABLE_HANDLE;
    uint32_t page;
    int rc = kvp_segalloc_alloc(s->alloc, np, &page);
    if (rc)
        return rc;
    s->used_pages += np;
    s->nrep++;
    m->used_pages += np;
    out->seg = si;
    out->page = page;
    out->gen = ++s->gen;
    return 0;
}

/*
 * Places one more replica of np pages on a segment not in reps[0..have).
 * Order: the preferred segment when it has room, then sampled segments by
 * most free space; when none has room, evicts LRU objects one at a time
 * (fairly across tenants, for tenant `who`: victim_tenant) and retries on
 * the segments each eviction freed, until it fits or nothing is evictable.
 * 0, KVP_ENO_AVAILABLE_HANDLE or KVP_ENOMEM.
 */
static int place_one(kvp_master *m, int who, uint32_t np, int pref, kvp_orep *reps,
                     unsigned have)
{
    int nomem = 0, rc;
    if (pref >= 0 && !used_seg(reps, have, (uint32_t)pref)) {
        rc = try_alloc(m, (uint32_t)pref, np, &reps[have]);
        if (rc == 0)
            return 0;
        nomem |= rc == KVP_ENOMEM;
    }
    /* candidates: all mounted segments when few, else a random sample */
    uint32_t cand[PLACE_CANDIDATES];
    unsigned nc = 0;
    if (m->nseg <= PLACE_CANDIDATES) {
        for (uint32_t i = 0; i < m->nseg; i++)
            cand[nc++] = m->mounted[i];
    } else {
        uint32_t start = (uint32_t)(rng_next(m) % m->nseg);
        for (uint32_t k = 0; k < PLACE_CANDIDATES; k++)
            cand[nc++] = m->mounted[(start + k) % m->nseg];
    }
    /* insertion sort by free pages, most first */
    for (unsigned i = 1; i < nc; i++) {
        uint32_t c = cand[i];
        uint64_t fc = kvp_segalloc_free_pages(m->segs[c]->alloc);
        unsigned j = i;
        while (j > 0 && kvp_segalloc_free_pages(m->segs[cand[j - 1]]->alloc) < fc) {
            cand[j] = cand[j - 1];
            j--;
        }
        cand[j] = c;
    }
    for (unsigned i = 0; i < nc; i++) {
        if ((int)cand[i] == pref || used_seg(reps, have, cand[i]))
            continue;
        rc = try_alloc(m, cand[i], np, &reps[have]);
        if (rc == 0)
            return 0;
        nomem |= rc == KVP_ENOMEM;
    }
    /* refuse before evicting anything when no eligible segment could hold
     * the replica even with all its evictable objects gone (bigger than the
     * segment, or the rest is pending, leased or pinned): otherwise one such
     * put would flush the whole cache and still fail */
    int could_fit = 0;
    for (uint32_t i = 0; i < m->nseg && !could_fit; i++) {
        const kvp_mseg *sg = m->segs[m->mounted[i]];
        could_fit = !used_seg(reps, have, m->mounted[i]) && !avoid(m, sg) &&
                    kvp_segalloc_free_pages(sg->alloc) + sg->lru_pages >= np;
    }
    if (!could_fit) {
        if (m->stats[KVP_STAT_SPILLING] > 0)
            m->stats[KVP_STAT_SPILL_PRESSURE]++;
        return KVP_ENO_AVAILABLE_HANDLE;
    }
    /* inline eviction: puts keep succeeding while anything is evictable;
     * victims being spilled free their room later, so once as much is on
     * its way to disk as this replica needs, the answer is -200 (the
     * writer's cue to back off) rather than spilling the whole cache */
    uint32_t freed[KVP_MAX_REPLICAS];
    int nf;
    uint64_t before = m->spill_total;
    while ((nf = evict_one(m, victim(m, who, 1.0, 1), freed, 1)) >= 0) {
        if (nf == 0 && m->spill_total - before >= np) {
            m->stats[KVP_STAT_SPILL_PRESSURE]++;
            return KVP_ENO_AVAILABLE_HANDLE;
        }
        for (unsigned i = 0; i < (unsigned)nf; i++) {
            if (used_seg(reps, have, freed[i]))
                continue;
            rc = try_alloc(m, freed[i], np, &reps[have]);
            if (rc == 0)
                return 0;
            nomem |= rc == KVP_ENOMEM;
        }
    }
    return nomem ? KVP_ENOMEM : KVP_ENO_AVAILABLE_HANDLE;
}

/* Background eviction above the high watermark, down to the low one
 * (counting room that spills in flight will free); victims from the
 * tenants over their share of the low watermark (victim_tenant). */
static unsigned evict_background(kvp_master *m, unsigned budget)
{
    if (m->cap_pages == 0 || (double)m->used_pages <= m->cfg.evict_high * (double)m->cap_pages)
        return 0;
    double low = m->cfg.evict_low * (double)m->cap_pages;
    unsigned n = 0;
    uint32_t freed[KVP_MAX_REPLICAS];
    while (n < budget && (double)(m->used_pages - m->spill_total) > low &&
           evict_one(m, victim(m, -1, m->cfg.evict_low, 0), freed, 1) >= 0)
        n++;
    return n;
}

/*
 * The soft-pin sweep: ends the pins that are over, moving their objects
 * from the soft list to the LRU list's tail (the next victims). Walks each
 * tenant's soft list from the tail with a cursor that list_unlink keeps
 * valid, up to `budget` objects per call, tenant after tenant: every
 * soft-listed object is looked at within about (soft-listed objects /
 * budget) ticks, long before a pin_until could pass for a future one (half
 * the 24-bit tick range less the longest TTL: over 1 h). Returns the
 * objects looked at.
 */
static unsigned pin_sweep(kvp_master *m, unsigned budget)
{
    unsigned n = 0;
    for (uint32_t k = 0; k < m->ntenants && n < budget; k++) {
        if (m->sweep_t >= m->ntenants)
            m->sweep_t = 0;
        mtenant *tq = &m->tq[m->sweep_t];
        kvp_obj *o = tq->sweep ? tq->sweep : tq->soft.tail;
        while (o && n < budget) {
            kvp_obj *prev = o->prev;
            n++;
            if (pin_over(o, m->now)) {
                list_unlink(m, o);
                o->softpin = 0;
                list_push_tail(m, KVP_LIST_LRU, o);
            }
            o = prev;
        }
        tq->sweep = o; /* NULL: this tenant's pass is done */
        if (o)
            break;
        m->sweep_t++;
    }
    return n;
}

/* ============================================================= leases */

enum { LEASE_GET, LEASE_LOOKUP };

/* A lease on o for `who`: GET (taking over a hold when there is one) or a
 * lookup's hold. The deadline becomes now + lease_ttl for every lease of o.
 * A count at LEASE_MAX (16 M leases within one lease_ttl) only renews the
 * deadline; a lookup finding HOLD_MAX holds adds a plain lease. */
static void lease_grant(kvp_master *m, kvp_obj *o, uint64_t now, int who)
{
    KVP_ASSERT(o->state == KVP_OBJ_COMPLETE);
    uint32_t n = lease_count(o), h = lease_holds(o);
    if (who == LEASE_GET && h > 0) {
        h--; /* take the hold over */
    } else if (n < LEASE_MAX) {
        n++;
        h += who == LEASE_LOOKUP && h < HOLD_MAX;
        m->stats[KVP_STAT_LEASES]++;
    }
    list_unlink(m, o);
    lease_set(o, n, h);
    o->deadline = ms32(now + m->cfg.lease_ttl_ms);
    list_push_tail(m, KVP_LIST_LEASED, o); /* all leases have one TTL: FIFO */
}

/* Ends every lease of o (expiry): a new lease epoch, so late RELEASEs of
 * the old leases are ignored. */
static void lease_expire_all(kvp_master *m, kvp_obj *o)
{
    KVP_ASSERT(m->stats[KVP_STAT_LEASES] >= lease_count(o));
    list_unlink(m, o);
    m->stats[KVP_STAT_LEASES] -= lease_count(o);
    o->aux = 0;
    o->lease_seq = ++m->lease_seq;
    settle_unleased(m, o);
}

static int is_leased(const kvp_obj *o, uint64_t now)
{
    return o->state == KVP_OBJ_COMPLETE && o->aux > 0 && !due(o->deadline, now);
}

/* =========================================================== handlers */

typedef struct req {
    kvp_master *m;
    kvp_msess *s;
    const kvp_frame_hdr *h;
    const uint8_t *body;
    kvp_arena *a;
    kvp_buf *out;
    uint64_t now;
} req;

static void reply_status(req *q, int status)
{
    size_t off = kvp_frame_begin(q->out, q->h->op, KVP_FLAG_RESPONSE, q->h->req_id, status);
    kvp_frame_end(q->out, off);
}

static size_t reply_begin(req *q) { return kvp_frame_begin(q->out, q->h->op, KVP_FLAG_RESPONSE, q->h->req_id, 0); }

static int reply_end(req *q, size_t off)
{
    kvp_frame_end(q->out, off);
    return 0;
}

/* A response of n items of at most per_item bytes must fit a frame. */
static int fits(const req *q, uint32_t n, size_t per_item)
{
    return (uint64_t)n * per_item + 64 <= q->m->cfg.max_frame;
}

static void reply_results(req *q, uint32_t n, const int32_t *codes)
{
    size_t off = reply_begin(q);
    kvp_msg_results r = {n, (int32_t *)codes};
    kvp_enc_results(q->out, &r);
    reply_end(q, off);
}

static int32_t *codes_alloc(req *q, uint32_t n)
{
    return kvp_arena_alloc(q->a, (size_t)n * sizeof(int32_t) + 1);
}

/* ============================================================== auth */

static struct authfail *authfail_slot(kvp_master *m, uint64_t peer)
{
    return &m->authfail[(peer * 0x9E3779B97F4A7C15ull) >> 54]; /* 1024 slots */
}

/*
 * Failed HELLOs per peer address. Credentials are always checked, so a
 * correct one is accepted whatever others from the same address (a NAT, a
 * shared host) got wrong; the back-off slows the guesser instead: past
 * AUTHFAIL_FREE failures, each failed HELLO is answered only after
 * AUTHFAIL_HOLD_MS (the service holds the answer, without blocking its
 * loop), with KVP_EAUTH_BACKOFF and how long the address's back-off (100 ms,
 * doubling to AUTHFAIL_MAX_MS) has left. A success does not clear the
 * record (a guesser sharing the address would get free attempts again);
 * it is forgotten once the back-off is over and the last failure is
 * AUTHFAIL_MAX_MS old. Returns the
 * back-off left (ms), 0 while the failures are still free.
 */
static uint64_t auth_failed(kvp_master *m, uint64_t peer, uint64_t now)
{
    if (!peer)
        return 0;
    struct authfail *f = authfail_slot(m, peer);
    if (f->peer != peer || (now >= f->until && now - f->last >= AUTHFAIL_MAX_MS)) {
        f->peer = peer;
        f->fails = 0;
        f->until = 0;
    }
    f->last = now;
    if (f->fails < UINT32_MAX)
        f->fails++;
    if (f->fails <= AUTHFAIL_FREE)
        return 0;
    uint32_t k = f->fails - AUTHFAIL_FREE - 1;
    uint64_t wait = k >= 9 ? AUTHFAIL_MAX_MS : 100ull << k;
    f->until = now + (wait > AUTHFAIL_MAX_MS ? AUTHFAIL_MAX_MS : wait);
    return f->until - now;
}

static void hello_refuse(req *q, int err);

/*
 * AUTH_CHALLENGE: a fresh server nonce and, for each credential the client
 * announced that this master holds, its server proof (proto/auth.h). The
 * tenant credential is found by its key id, which is not secret. Answered
 * once per HELLO: a second challenge before the HELLO is refused (and, on a
 * connection not past HELLO, closed; before HELLO a connection is also under the service's
 * small-frame and deadline limits). Nothing here is counted against the
 * peer: a challenge reveals no secret either way.
 */
static void op_challenge(req *q)
{
    kvp_msg_challenge ch;
    kvp_master *m = q->m;
    kvp_msess *s = q->s;
    int rc = kvp_dec_challenge(q->body, q->h->body_len, &ch) != 0 ? KVP_EPROTOCOL
             : ch.version != KVP_PROTO_VERSION                     ? KVP_EINVALID_VERSION
             : s->challenged                                       ? KVP_EPROTOCOL
                                                                   : 0;
    if (rc) {
        reply_status(q, rc);
        if (!s->client) /* before HELLO the connection goes; after, only the request fails */
            s->close_after = 1;
        return;
    }
    /* phase 1: the transcript */
    kvp_auth_tx *t = &s->auth;
    memset(t, 0, sizeof *t);
    memcpy(t->client_nonce, ch.nonce.p, KVP_AUTH_NONCE);
    if (kvp_auth_nonce(t->server_nonce) != 0) {
        hello_refuse(q, KVP_EINTERNAL_ERROR);
        return;
    }
    t->server_id = m->id;
    t->has = ch.has;
    if (ch.kid.len)
        memcpy(t->kid, ch.kid.p, KVP_AUTH_KID);
    s->auth_tcred = -1;
    for (size_t i = 0; ch.kid.len && i < m->ntcreds && s->auth_tcred < 0; i++)
        if (!memcmp(m->tcreds[i].kid, t->kid, KVP_AUTH_KID))
            s->auth_tcred = (int)i;
    s->challenged = 1;
    /* phase 2: the proofs this master can give */
    const char *key[3] = {m->cfg.cluster_token, m->cfg.node_token,
                          s->auth_tcred >= 0 ? m->tcreds[s->auth_tcred].token : ""};
    uint8_t pr[3][KVP_AUTH_PROOF];
    kvp_msg_challenge_resp r = {{t->server_nonce, KVP_AUTH_NONCE}, m->id, {{NULL, 0}}};
    for (int c = 0; c < 3; c++) {
        if (!(t->has & KVP_AUTH_HAS(c)) || !key[c][0])
            continue;
        kvp_auth_server_proof(t, c, key[c], strlen(key[c]), pr[c]);
        r.proof[c] = (kvp_bytes){pr[c], KVP_AUTH_PROOF};
    }
    size_t off = reply_begin(q);
    kvp_enc_challenge_resp(q->out, &r);
    reply_end(q, off);
}

/* Does `proof` show the token `key` for credential `cred` on this
 * connection? Constant time for a proof of the right length. */
static int proof_ok(const kvp_msess *s, int cred, uint64_t client_id, const char *key,
                    size_t klen, kvp_bytes proof)
{
    uint8_t want[KVP_AUTH_PROOF];
    kvp_auth_client_proof(&s->auth, cred, client_id, key, klen, want);
    return kvp_auth_proof_ok(proof.p, proof.len, want);
}

/* Which credentials the HELLO proves: *node, *tcred (-1 none). 0 or
 * KVP_EAUTH. A proof needs the challenge answered on this connection (the
 * caller consumes it) and a credential announced there; a master with a
 * cluster token needs its proof. A HELLO without a challenge proves
 * nothing: accepted only by a master without a cluster token, claiming no
 * credential. */
static int hello_creds(const kvp_master *m, const kvp_msess *s, const kvp_msg_hello *h, int *node,
                       int *tcred)
{
    const char *ct = m->cfg.cluster_token;
    *node = 0;
    *tcred = -1;
    if (!s->challenged)
        return ct[0] || h->proof[KVP_AUTH_CLUSTER].len || h->proof[KVP_AUTH_NODE].len ||
                       h->proof[KVP_AUTH_TENANT].len ? KVP_EAUTH : 0;
    uint8_t has = s->auth.has;
    if (ct[0] && (!(has & KVP_AUTH_HAS(KVP_AUTH_CLUSTER)) ||
                  !proof_ok(s, KVP_AUTH_CLUSTER, h->client_id, ct, strlen(ct),
                            h->proof[KVP_AUTH_CLUSTER])))
        return KVP_EAUTH;
    if (h->proof[KVP_AUTH_NODE].len) {
        const char *nt = m->cfg.node_token;
        if (!nt[0] || !(has & KVP_AUTH_HAS(KVP_AUTH_NODE)) ||
            !proof_ok(s, KVP_AUTH_NODE, h->client_id, nt, strlen(nt), h->proof[KVP_AUTH_NODE]))
            return KVP_EAUTH;
        *node = 1;
    }
    if (h->proof[KVP_AUTH_TENANT].len) {
        int i = s->auth_tcred;
        if (i < 0 || !(has & KVP_AUTH_HAS(KVP_AUTH_TENANT)) ||
            !proof_ok(s, KVP_AUTH_TENANT, h->client_id, m->tcreds[i].token,
                      strlen(m->tcreds[i].token), h->proof[KVP_AUTH_TENANT]))
            return KVP_EAUTH;
        *tcred = i;
    }
    return 0;
}

/* May the HELLO join `c`, a live client with its id? Only with the proof of
 * the session secret the master gave it, over this connection's challenge
 * (the secret itself never crosses again), and the same credentials. */
static int hello_joins(const kvp_msess *s, const kvp_msg_hello *h, const kvp_mclient *c, int node,
                       int tcred)
{
    return s->challenged && (s->auth.has & KVP_AUTH_HAS(KVP_AUTH_SESSION)) &&
           proof_ok(s, KVP_AUTH_SESSION, h->client_id, (const char *)c->session, KVP_SESSION_LEN,
                    h->proof[KVP_AUTH_SESSION]) &&
           c->node == node && c->tcred == tcred;
}

static void hello_refuse(req *q, int err)
{
    reply_status(q, err);
    q->s->close_after = 1;
}

/* A HELLO refused for its credentials (err: KVP_EAUTH, KVP_EILLEGAL_CLIENT):
 * counted against the peer; past the free failures answered late with
 * KVP_EAUTH_BACKOFF (auth_failed). */
static void hello_refuse_cred(req *q, int err)
{
    uint64_t left = auth_failed(q->m, q->s->peer, q->now);
    if (!left) {
        hello_refuse(q, err);
        return;
    }
    KVP_WARN_LIMITED(MOD, "HELLO from %s refused: too many failed attempts; answered after "
                          "%u ms, back-off %llu ms",
                     q->s->peer_addr, AUTHFAIL_HOLD_MS, (unsigned long long)left);
    uint64_t after = left > AUTHFAIL_HOLD_MS ? left - AUTHFAIL_HOLD_MS : 0;
    const char *a = q->s->peer_addr;
    size_t al = strnlen(a, sizeof q->s->peer_addr);
    kvp_msg_hello_backoff b = {(uint32_t)after,
                               {(const uint8_t *)a, (uint32_t)(al > KVP_BACKOFF_ADDR_MAX
                                                                   ? KVP_BACKOFF_ADDR_MAX
                                                                   : al)}};
    size_t off = kvp_frame_begin(q->out, q->h->op, KVP_FLAG_RESPONSE, q->h->req_id,
                                 KVP_EAUTH_BACKOFF);
    kvp_enc_hello_backoff(q->out, &b);
    kvp_frame_end(q->out, off);
    q->s->close_after = 1;
    q->s->hold_ms = AUTHFAIL_HOLD_MS;
}

/*
 * HELLO: version, credentials (proofs over this connection's challenge,
 * hello_creds), identity. A refused HELLO closes the connection; an
 * accepted one consumes the challenge. A client_id already live is
 * joined only with a proof of the session secret the master gave it (so knowing an
 * id, which the logs show, is not enough to act as that client); a new id
 * gets a fresh secret. The credentials of every connection of a client
 * must agree.
 */
static void op_hello(req *q)
{
    kvp_msg_hello h;
    kvp_master *m = q->m;
    int rc = kvp_dec_hello(q->body, q->h->body_len, &m->lim, &h);
    if (rc || h.client_id == 0) {
        hello_refuse(q, KVP_EPROTOCOL);
        return;
    }
    if (h.version != KVP_PROTO_VERSION) {
        KVP_WARN_LIMITED(MOD, "HELLO with protocol version %u refused (this master speaks %u)",
                         h.version, KVP_PROTO_VERSION);
        hello_refuse(q, KVP_EINVALID_VERSION);
        return;
    }
    /* phase 1: credentials, always checked; a peer that keeps failing is
     * answered late (hello_refuse_cred) */
    int node, tcred;
    rc = hello_creds(m, q->s, &h, &node, &tcred);
    if (rc != 0) {
        q->s->challenged = 0; /* a challenge serves one HELLO */
        KVP_WARN_LIMITED(MOD, "HELLO from %s refused: wrong credential", q->s->peer_addr);
        hello_refuse_cred(q, KVP_EAUTH);
        return;
    }
    /* phase 2: identity */
    kvp_mclient *c = q->s->client;
    if (c && c->id != h.client_id) {
        hello_refuse(q, KVP_EPROTOCOL); /* one identity per connection */
        return;
    }
    if (!c) {
        c = client_find(m, h.client_id);
        if (c && !hello_joins(q->s, &h, c, node, tcred)) {
            q->s->challenged = 0;
            KVP_WARN_LIMITED(MOD, "HELLO refused: a client id already in use, without its "
                                  "session secret or with other credentials");
            hello_refuse_cred(q, KVP_EILLEGAL_CLIENT);
            return;
        }
        if (!c) {
            rc = client_new(m, h.client_id, h.name, q->now, &c);
            if (rc) {
                hello_refuse(q, rc);
                return;
            }
            c->node = node;
            c->tcred = tcred;
            if (getrandom(c->session, sizeof c->session, 0) != (ssize_t)sizeof c->session) {
                client_free(m, c);
                hello_refuse(q, KVP_EINTERNAL_ERROR);
                return;
            }
            KVP_DEBUG(MOD, "client %016llx (%s) connected", (unsigned long long)c->id, c->name);
        }
        c->nconns++;
        q->s->client = c;
    }
    q->s->challenged = 0; /* a challenge serves one HELLO */
    c->last_seen = q->now;
    kvp_msg_hello_resp r = {KVP_PROTO_VERSION, m->id, (uint32_t)m->cfg.max_frame,
                            (uint32_t)m->cfg.lease_ttl_ms, (uint32_t)m->cfg.client_ttl_ms,
                            q->now, {0}, KVPOOL_VERSION_STRING};
    memcpy(r.session, c->session, sizeof r.session);
    size_t off = reply_begin(q);
    kvp_enc_hello_resp(q->out, &r);
    reply_end(q, off);
}

/* May this client mount and unmount segments? With a node_token, only its
 * holders; otherwise any client not bound to a tenant. */
static int may_mount(const kvp_master *m, const kvp_mclient *c)
{
    return m->cfg.node_token[0] ? c->node : c->tcred < 0 || c->node;
}

static void op_mount(req *q)
{
    kvp_msg_mount d;
    if (kvp_dec_mount(q->body, q->h->body_len, &q->m->lim, q->a, &d)) {
        reply_status(q, KVP_EPROTOCOL);
        return;
    }
    if (!may_mount(q->m, q->s->client)) {
        KVP_WARN_LIMITED(MOD, "MOUNT_SEGMENT refused: client %s lacks the node credential",
                         q->s->client->name);
        reply_status(q, KVP_EILLEGAL_CLIENT);
        return;
    }
    int32_t *codes = codes_alloc(q, d.n);
    if (!codes) {
        reply_status(q, KVP_ENOMEM);
        return;
    }
    for (uint32_t i = 0; i < d.n; i++)
        codes[i] = seg_mount(q->m, q->s->client, &d.segs[i]);
    q->s->client->notify = q->s;
    reply_results(q, d.n, codes);
}

static void op_unmount(req *q)
{
    kvp_msg_ids d;
    if (kvp_dec_ids(q->body, q->h->body_len, &q->m->lim, q->a, &d)) {
        reply_status(q, KVP_EPROTOCOL);
        return;
    }
    if (!may_mount(q->m, q->s->client)) {
        reply_status(q, KVP_EILLEGAL_CLIENT);
        return;
    }
    int32_t *codes = codes_alloc(q, d.n);
    if (!codes) {
        reply_status(q, KVP_ENOMEM);
        return;
    }
    for (uint32_t i = 0; i < d.n; i++) {
        int si = seg_find_id(q->m, d.ids[i]);
        if (si < 0)
            codes[i] = KVP_ESEGMENT_NOT_FOUND;
        else if (q->m->segs[si]->owner != q->s->client)
            codes[i] = KVP_EILLEGAL_CLIENT;
        else {
            seg_unmount(q->m, (uint32_t)si);
            codes[i] = 0;
        }
    }
    reply_results(q, d.n, codes);
}

/*
 * SEG_FREED_ACK (ONEWAY, from the segment's owner): {segment id, seq}: the
 * node applied the notices up to seq and stopped their transfers. They
 * leave the queue, and the space quarantined behind them is free. Anything
 * else (another client's segment, a seq not sent) is ignored. Answered, as
 * REPLICA_BAD, when the body cannot be decoded or it came as a request.
 */
static void op_seg_freed_ack(req *q)
{
    kvp_master *m = q->m;
    int oneway = (q->h->flags & KVP_FLAG_ONEWAY) != 0;
    kvp_msg_ids d;
    if (kvp_dec_ids(q->body, q->h->body_len, &m->lim, q->a, &d) || d.n != 2) {
        reply_status(q, KVP_EPROTOCOL);
        return;
    }
    int si = seg_find_id(m, d.ids[0]);
    kvp_mseg *s = si >= 0 ? m->segs[si] : NULL;
    uint64_t seq = d.ids[1];
    if (s && s->owner == q->s->client && seq >= s->seq_head && seq < s->seq_head + s->nsent) {
        uint32_t k = (uint32_t)(seq - s->seq_head + 1);
        memmove(s->ntc, s->ntc + k, (s->nntc - k) * sizeof *s->ntc);
        s->nntc -= k;
        s->nsent -= k;
        s->seq_head += k;
        xq_release(m, (uint32_t)si, seq);
    }
    if (!oneway)
        reply_status(q, 0);
}

/*
 * Data-path reports. The pool's figures per path (KVP_STAT_PATH) are the
 * sum of every client's last report, live or departed: a report replaces
 * its client's previous one in the sum (stats += new - old, exact modulo
 * 2^64 whatever the values), and a client that leaves (disconnect, TTL)
 * takes nothing out, so its last report stays counted; what it moved after
 * that report is lost to the pool's figures. They are what clients claim,
 * checked for their encoding only. Not replicated to standbys: a new leader
 * (or a restarted master) starts from 0 and learns its clients' figures
 * from their next heartbeats (the client reports its whole life to a master
 * it has not reported to).
 */
static void client_report(kvp_master *m, kvp_mclient *c, const kvp_msg_heartbeat *d)
{
    for (unsigned p = 0; p < KVP_STAT_NPATHS; p++) {
        const kvp_path_tally *t = &d->paths[p]; /* zeros past d->npaths */
        const uint64_t v[KVP_STAT_PATH_FIELDS] = {t->put_bytes, t->get_bytes, t->put_ops,
                                                  t->get_ops};
        for (unsigned f = 0; f < KVP_STAT_PATH_FIELDS; f++) {
            uint64_t *was = &c->report[p * KVP_STAT_PATH_FIELDS + f];
            m->stats[KVP_STAT_PATH(p, f)] += v[f] - *was;
            *was = v[f];
        }
    }
}

/* HEARTBEAT: an empty body, or a data-path report (proto.h); ONEWAY: no
 * answer (a closing client's last report). */
static void op_heartbeat(req *q)
{
    int oneway = (q->h->flags & KVP_FLAG_ONEWAY) != 0;
    if (q->h->body_len != 0) {
        kvp_msg_heartbeat d;
        if (kvp_dec_heartbeat(q->body, q->h->body_len, &d)) {
            reply_status(q, KVP_EPROTOCOL);
            return;
        }
        client_report(q->m, q->s->client, &d);
    }
    /* the owner is alive and reaching us: its segments take puts again */
    for (uint32_t i = 0; q->m->nsuspect && i < q->m->nseg; i++) {
        kvp_mseg *sg = q->m->segs[q->m->mounted[i]];
        if (sg->suspect && sg->owner == q->s->client) {
            KVP_ASSERT(q->m->nsuspect > 0);
            sg->suspect = 0;
            q->m->nsuspect--;
        }
    }
    if (oneway)
        return;
    kvp_msg_heartbeat_resp r = {q->m->id, q->s->client->nseg, q->now};
    size_t off = reply_begin(q);
    kvp_enc_heartbeat_resp(q->out, &r);
    reply_end(q, off);
}

/* Wire descriptors of n replicas of a size-byte object for one operation
 * (KVP_ACCESS_*) until expires_ms, tagged with each segment's secret.
 * Returns n. */
static uint32_t describe(const kvp_master *m, const kvp_orep *reps, unsigned n, uint64_t size,
                         uint32_t access, uint64_t expires_ms, kvp_replica *out)
{
    for (unsigned j = 0; j < n; j++) {
        const kvp_mseg *sg = m->segs[reps[j].seg];
        out[j].segment_id = sg->id;
        out[j].offset = (uint64_t)reps[j].page << 12;
        out[j].length = size;
        out[j].generation = wire_gen(sg, reps[j].gen);
        out[j].expires_ms = expires_ms;
        out[j].access = access;
        out[j].tag = kvp_replica_tag(sg->secret, &out[j]);
    }
    return n;
}

static int key_ok(const kvp_master *m, kvp_bytes k) { return k.len >= 1 && k.len <= m->cfg.max_key; }

/*
 * The largest value the pool can keep: max_object_size, and no more than
 * the low watermark's share of the pool -- above it, background eviction
 * would run until it evicted the new object itself, after flushing
 * everything else. Checked before anything is allocated or evicted.
 */
static uint64_t keep_limit(const kvp_master *m)
{
    uint64_t lim = m->cfg.max_object_size;
    if (m->cap_pages > 0) {
        uint64_t pool = (uint64_t)(m->cfg.evict_low * (double)m->cap_pages) << 12;
        if (pool < lim)
            lim = pool;
    }
    return lim;
}

/*
 * Tenant t's quotas before placing `*want` replicas of np pages: over
 * max_objects, its own least recently used objects are removed; over
 * max_pages, its own objects are evicted (spilled with an SSD tier) until
 * the replicas fit, with fewer replicas when even that many never could.
 * 0, KVP_EOBJECT_TOO_LARGE (one replica is over max_bytes), or
 * KVP_ENO_AVAILABLE_HANDLE: nothing of its own is evictable now, or its
 * spills in flight will make the room (the writer backs off, as when the
 * pool is full). Called inside PUT_START, whose pin counts in tenant_nobj.
 */
static int quota_room(kvp_master *m, int t, uint32_t np, unsigned *want)
{
    mtenant *tq = &m->tq[t];
    uint32_t freed[KVP_MAX_REPLICAS];
    if (tq->max_objects) {
        while (m->tenant_nobj[t] - 1 >= tq->max_objects && evict_one(m, own_victim(m, t), freed, 0) >= 0)
            ;
        if (m->tenant_nobj[t] - 1 >= tq->max_objects) {
            tq->refused++;
            return KVP_ENO_AVAILABLE_HANDLE;
        }
    }
    if (!tq->max_pages)
        return 0;
    if (np > tq->max_pages)
        return KVP_EOBJECT_TOO_LARGE;
    if ((uint64_t)np * *want > tq->max_pages)
        *want = (unsigned)(tq->max_pages / np); /* best effort, as for segments */
    /* a victim being spilled keeps its DRAM until durable: count what is
     * on its way out (at least one replica's pages each) */
    uint64_t need = (uint64_t)np * *want, before = m->spill_total;
    while (tq->pages - (m->spill_total - before) + need > tq->max_pages &&
           evict_one(m, own_victim(m, t), freed, 1) >= 0)
        ;
    if (tq->pages + need <= tq->max_pages)
        return 0;
    tq->refused++;
    return KVP_ENO_AVAILABLE_HANDLE;
}

/*
 * The soft pin a PUT_START asks for (proto.h, KVP_PUT_SOFT_*), checked as
 * Mooncake checks it: 0 and *ttl (ms; 0 = clear) for SOFT_PIN, or
 * KVP_EINVALID_PARAMS for a TTL without SOFT_PIN, SOFT_PIN with SOFT_UNPIN,
 * or a TTL over soft_pin_max_ttl.
 */
static int soft_pin_of(const kvp_master *m, const kvp_msg_put_start *d, uint32_t *ttl)
{
    uint32_t f = d->flags;
    *ttl = 0;
    if ((f & KVP_PUT_F_SOFT_TTL) ? !(f & KVP_PUT_F_SOFT_PIN) : d->soft_ttl_ms != 0)
        return KVP_EINVALID_PARAMS;
    if ((f & KVP_PUT_F_SOFT_PIN) && (f & KVP_PUT_F_SOFT_UNPIN))
        return KVP_EINVALID_PARAMS;
    if (!(f & KVP_PUT_F_SOFT_PIN))
        return 0;
    uint64_t t = (f & KVP_PUT_F_SOFT_TTL) ? d->soft_ttl_ms : m->cfg.soft_pin_ttl_ms;
    if (t > m->cfg.soft_pin_max_ttl_ms)
        return KVP_EINVALID_PARAMS;
    *ttl = (uint32_t)t; /* config keeps the maximum within KVP_PIN_MAX_TTL_MS */
    return 0;
}

/*
 * Whether key k (hash h) may get a new object, and where it goes: 0 into
 * the index (a new key, or REPLACE of an absent one), 1 into m->repl (a
 * REPLACE of a complete object, which stays readable meanwhile), or a
 * code: OBJECT_ALREADY_EXISTS (a plain put of a key that has an object or
 * a pending replacement: first writer wins), REPLICA_IS_NOT_READY (a
 * REPLACE of a key being written).
 */
static int put_target(kvp_master *m, int tenant, kvp_bytes k, uint64_t h, int replace)
{
    kvp_obj *old = kvp_index_find(&m->ix, h, (uint16_t)tenant, k.p, k.len);
    kvp_obj *pend = m->repl.count ? kvp_index_find(&m->repl, h, (uint16_t)tenant, k.p, k.len)
                                  : NULL;
    if (!replace)
        return old || pend ? KVP_EOBJECT_ALREADY_EXISTS : 0;
    if (pend || (old && old->state != KVP_OBJ_COMPLETE))
        return KVP_EREPLICA_IS_NOT_READY;
    return old ? 1 : 0;
}

static void op_put_start(req *q)
{
    kvp_master *m = q->m;
    kvp_msg_put_start d;
    if (kvp_dec_put_start(q->body, q->h->body_len, &m->lim, q->a, &d)) {
        reply_status(q, KVP_EPROTOCOL);
        return;
    }
    uint32_t ttl;
    if (d.replicas < 1 || d.replicas > KVP_MAX_REPLICAS || (d.flags & ~(uint32_t)KVP_PUT_F__ALL) ||
        soft_pin_of(m, &d, &ttl)) {
        reply_status(q, KVP_EINVALID_PARAMS);
        return;
    }
    int replace = (d.flags & KVP_PUT_F_REPLACE) != 0;
    if (!fits(q, d.n, 8 + KVP_SEG_IO_SIZE * KVP_MAX_REPLICAS)) {
        reply_status(q, KVP_ETOO_LARGE);
        return;
    }
    int tenant = tenant_allowed(m, q->s->client, d.tenant);
    if (tenant == 0)
        tenant = tenant_get(m, d.tenant);
    if (tenant < 0) {
        reply_status(q, tenant);
        return;
    }
    m->tenant_nobj[tenant]++; /* pinned: inline eviction may empty it meanwhile */
    int pref = seg_find_name(m, d.preferred);
    uint64_t keep = keep_limit(m);
    size_t off = reply_begin(q);
    kvp_buf_u32(q->out, d.n);
    for (uint32_t i = 0; i < d.n; i++) {
        kvp_put_result r = {0};
        kvp_bytes k = d.keys[i];
        uint64_t h = kvp_index_hash((uint16_t)tenant, k.p, k.len);
        kvp_orep reps[KVP_MAX_REPLICAS];
        unsigned have = 0;
        kvp_obj *o = NULL;
        uint32_t np = kvp_pages(d.sizes[i]);
        int into = 0; /* 1: a replacement, into m->repl */
        const kvp_blkinfo *bi = d.blocks ? &d.blocks[i] : NULL;
        int blk = 0; /* 1: the record holds a block (master/kvblk.h) */
        if (!key_ok(m, k)) {
            r.status = KVP_EINVALID_KEY;
        } else if (bi && (blk = kvp_kvblk_admit(m->kb, (uint16_t)tenant, bi)) < 0) {
            r.status = blk;
        } else if (d.sizes[i] == 0) {
            r.status = KVP_EINVALID_PARAMS;
        } else if (d.sizes[i] > keep) {
            r.status = KVP_EOBJECT_TOO_LARGE;
        } else if ((into = put_target(m, tenant, k, h, replace)) < 0) {
            r.status = into;
        } else if ((r.status = kvp_index_reserve(into ? &m->repl : &m->ix)) == 0) {
            uint32_t freed[KVP_MAX_REPLICAS];
            while (m->cfg.max_objects && m->ix.count >= m->cfg.max_objects &&
                   evict_one(m, victim(m, tenant, 1.0, 1), freed, 0) >= 0)
                ;
            if (m->cfg.max_objects && m->ix.count >= m->cfg.max_objects)
                r.status = KVP_ENO_AVAILABLE_HANDLE;
            /* metadata memory: evict the oldest objects, as for space */
            while (r.status == 0 && kvp_mem_used() > m->cfg.max_master_memory &&
                   evict_one(m, victim(m, tenant, 1.0, 1), freed, 0) >= 0)
                ;
            if (r.status == 0 && kvp_mem_used() > m->cfg.max_master_memory)
                r.status = KVP_ENO_AVAILABLE_HANDLE;
            unsigned want = d.replicas < m->nseg ? d.replicas : m->nseg;
            if (want == 0 && r.status == 0)
                r.status = KVP_ENO_AVAILABLE_HANDLE;
            if (r.status == 0)
                r.status = quota_room(m, tenant, np, &want);
            while (r.status == 0 && have < want) {
                int rc = place_one(m, tenant, np, pref, reps, have);
                if (rc) {
                    if (have == 0)
                        r.status = rc;
                    break; /* fewer replicas than asked: best effort */
                }
                have++;
            }
            if (r.status == 0) {
                o = kvp_salloc(kvp_obj_bytes(k.len, (uint8_t)have, blk));
                if (!o)
                    r.status = KVP_ENOMEM;
            }
        }
        if (r.status == 0) {
            memset(o, 0, sizeof *o);
            o->size = d.sizes[i];
            o->tenant = (uint16_t)tenant;
            o->keylen = (uint16_t)k.len;
            o->state = KVP_OBJ_PENDING;
            o->nrep = o->rep_cap = (uint8_t)have;
            o->flags = (d.flags & KVP_PUT_PIN) ? KVP_OBJ_PINNED : 0;
            /* the soft pin is settled at PUT_END (put_end_pin) */
            o->softpin = (d.flags & KVP_PUT_F_SOFT_PIN) != 0;
            o->pin_until = o->softpin ? pin_ticks(ttl) : 0;
            if (into && !(d.flags & (KVP_PUT_F_SOFT_PIN | KVP_PUT_F_SOFT_UNPIN)))
                o->pin_until = KVP_PIN_KEEP; /* an upsert keeps the old pin */
            o->replacing = into != 0;
            o->aux = q->s->client->slot;
            o->deadline = ms32(q->now + m->cfg.put_timeout_ms);
            o->exposed = o->deadline; /* its WRITE descriptors' expiry */
            o->lease_seq = ++m->lease_seq;
            if (blk) {
                /* pending, checksum and disk_rec hold the parent until PUT_END */
                o->blk = 1;
                o->group = bi->group & KVP_OBJ_MAX_GROUP;
                memcpy(o + 1, &bi->hash, sizeof bi->hash);
                o->checksum = bi->parent;
                o->disk_rec = (bi->flags & KVP_BLK_F_PARENT) != 0;
            }
            memcpy((uint8_t *)kvp_obj_key(o), k.p, k.len);
            memcpy(kvp_obj_reps(o), reps, have * sizeof *reps);
            kvp_index_insert(into ? &m->repl : &m->ix, h, o);
            if (blk)
                kvp_kvblk_insert(m->kb, o);
            m->tenant_nobj[tenant]++;
            tenant_pages(m, o, (int)have);
            m->tq[tenant].bytes += o->size;
            list_push_tail(m, KVP_LIST_PENDING, o);
            m->stats[KVP_STAT_PENDING]++;
            r.n_replicas = describe(m, reps, have, d.sizes[i], KVP_ACCESS_WRITE,
                                    q->now + m->cfg.put_timeout_ms, r.replicas);
        } else {
            for (unsigned j = 0; j < have; j++) /* undo a partial placement */
                free_unexposed(m, &reps[j], d.sizes[i]);
        }
        kvp_enc_put_result(q->out, &r);
    }
    m->tenant_nobj[tenant]--;
    tenant_release_if_empty(m, tenant); /* nothing stored: no tenant */
    reply_end(q, off);
}

/*
 * Batched lookup of keys[0..n) in order, with software prefetching: while
 * key i is looked up, the hash of key i+LK_AHEAD is computed and its index
 * slot prefetched, hiding most of the slot's cache miss (batched EXIST went
 * from ~0.3 to ~0.2 us per key at 1 M objects). Call lk_next for i = 0, 1, ...
 */
#define LK_AHEAD 8
typedef struct lk {
    kvp_master *m;
    int tenant;
    const kvp_bytes *keys;
    uint32_t n, i;
    uint64_t h[LK_AHEAD];
} lk;

static void lk_hash(lk *l, uint32_t i)
{
    kvp_bytes k = l->keys[i];
    if (l->tenant < 0 || !key_ok(l->m, k))
        return;
    uint64_t h = kvp_index_hash((uint16_t)l->tenant, k.p, k.len);
    l->h[i % LK_AHEAD] = h;
    kvp_index_prefetch(&l->m->ix, h);
}

static void lk_init(lk *l, kvp_master *m, int tenant, const kvp_bytes *keys, uint32_t n)
{
    l->m = m;
    l->tenant = tenant;
    l->keys = keys;
    l->n = n;
    l->i = 0;
    for (uint32_t i = 0; i < n && i < LK_AHEAD; i++)
        lk_hash(l, i);
}

static kvp_obj *lk_next(lk *l)
{
    uint32_t i = l->i++;
    kvp_bytes k = l->keys[i];
    kvp_obj *o = NULL;
    if (l->tenant >= 0 && key_ok(l->m, k))
        o = kvp_index_find(&l->m->ix, l->h[i % LK_AHEAD], (uint16_t)l->tenant, k.p, k.len);
    if (i + LK_AHEAD < l->n)
        lk_hash(l, i + LK_AHEAD);
    return o;
}

/*
 * The per-key operations PUT_END, PUT_REVOKE, RELEASE and REMOVE share one
 * driver: look every key up (batched, prefetched), apply `fn` to each, and
 * answer one code per key (unless `answer` is 0: a one-way RELEASE).
 * `o` is NULL for an unknown key; `arg` is the key's u64 (checksum, lease
 * id) when the request carries one.
 */
typedef int32_t (*key_fn)(req *q, kvp_obj *o, uint64_t arg, int force);
static int32_t do_put_end(req *q, kvp_obj *o, uint64_t checksum, int force);
static int32_t do_put_revoke(req *q, kvp_obj *o, uint64_t arg, int force);

/* The pending replacement of key k that this client writes, else o (what
 * PUT_END and PUT_REVOKE act on: the writer's object). */
static kvp_obj *writers_obj(req *q, int tenant, kvp_bytes k, kvp_obj *o)
{
    kvp_master *m = q->m;
    if (!m->repl.count || tenant < 0 || !key_ok(m, k))
        return o;
    uint64_t h = kvp_index_hash((uint16_t)tenant, k.p, k.len);
    kvp_obj *r = kvp_index_find(&m->repl, h, (uint16_t)tenant, k.p, k.len);
    return r && r->aux == q->s->client->slot ? r : o;
}

static void keyed_op(req *q, kvp_bytes tenant, uint32_t n, const kvp_bytes *keys,
                     const uint64_t *args, int force, int answer, key_fn fn)
{
    kvp_master *m = q->m;
    int rc = tenant_allowed(m, q->s->client, tenant);
    if (rc) {
        if (answer)
            reply_status(q, rc);
        return;
    }
    int32_t *codes = codes_alloc(q, n);
    if (!codes) {
        reply_status(q, KVP_ENOMEM);
        return;
    }
    lk l;
    int t = tenant_find(m, tenant);
    int writes = fn == do_put_end || fn == do_put_revoke;
    lk_init(&l, m, t, keys, n);
    for (uint32_t i = 0; i < n; i++) {
        kvp_obj *o = lk_next(&l);
        if (writes)
            o = writers_obj(q, t, keys[i], o);
        codes[i] = fn(q, o, args ? args[i] : 0, force);
    }
    if (answer)
        reply_results(q, n, codes);
}

/*
 * A replacement's PUT_END: the old object (if it is still there) goes and
 * o takes its place in the index, in one step. Its soft pin, when the put
 * kept it, is read first (*keep, *until). 0 or KVP_ENOMEM (nothing changed).
 */
static int32_t replace_commit(kvp_master *m, kvp_obj *o, int *keep, uint32_t *until)
{
    uint64_t h = kvp_index_hash(o->tenant, kvp_obj_key(o), o->keylen);
    kvp_obj *old = kvp_index_find(&m->ix, h, o->tenant, kvp_obj_key(o), o->keylen);
    /* put_target keeps a key with a pending replacement from getting a
     * pending object in the index */
    KVP_ASSERT(!old || old->state == KVP_OBJ_COMPLETE);
    if (kvp_index_reserve(&m->ix))
        return KVP_ENOMEM;
    if (old && old->softpin && !pin_over(old, m->now)) {
        *keep = 1;
        *until = old->pin_until;
    }
    if (old)
        obj_destroy(m, old, GONE_REMOVED);
    kvp_index_remove(&m->repl, o);
    o->replacing = 0;
    kvp_index_insert(&m->ix, h, o);
    return 0;
}

/* The soft pin a put settles at PUT_END: the one it asked for (from now),
 * or the replaced object's (keep), or none. */
static void put_end_pin(kvp_master *m, kvp_obj *o, int keep, uint32_t until)
{
    if (o->softpin) {
        o->softpin = o->pin_until > 0; /* a TTL of 0 clears */
        pin_set(o, m->now, (uint32_t)o->pin_until);
    } else if (keep && o->pin_until == KVP_PIN_KEEP) {
        o->softpin = 1;
        o->pin_until = until;
    }
    if (!o->softpin)
        o->pin_until = 0;
}

static int32_t do_put_end(req *q, kvp_obj *o, uint64_t checksum, int force)
{
    kvp_master *m = q->m;
    (void)force;
    if (!o)
        return KVP_EOBJECT_NOT_FOUND;
    if (o->state == KVP_OBJ_COMPLETE) /* a retried PUT_END: idempotent */
        return o->checksum == checksum ? 0 : KVP_EOBJECT_ALREADY_EXISTS;
    if (o->aux != q->s->client->slot)
        return KVP_EILLEGAL_CLIENT;
    KVP_ASSERT(o->list == KVP_LIST_PENDING && m->stats[KVP_STAT_PENDING] > 0);
    int keep = 0;
    uint32_t until = 0;
    if (o->replacing) {
        int32_t rc = replace_commit(m, o, &keep, &until);
        if (rc)
            return rc;
    }
    put_end_pin(m, o, keep, until);
    list_unlink(m, o);
    uint64_t parent = o->checksum; /* with a block: see op_put_start */
    int has_parent = o->blk && o->disk_rec;
    o->disk_rec = 0;
    o->state = KVP_OBJ_COMPLETE;
    o->checksum = checksum;
    o->aux = 0;
    /* its bytes are final: the WRITE descriptors die now, not at the put
     * deadline (a write in flight is cut); from here o->exposed waits for
     * the node to acknowledge that (exposed()) */
    kvp_orep *r = kvp_obj_reps(o);
    for (unsigned i = 0; i < o->nrep; i++)
        note_freed(m, m->segs[r[i].seg], r[i].seg, r[i].page, kvp_pages(o->size), r[i].gen,
                   KVP_FREED_PUBLISHED);
    o->exposed = m->stamp;
    settle_unleased(m, o);
    m->stats[KVP_STAT_PENDING]--;
    m->stats[KVP_STAT_OBJECTS]++;
    m->stats[KVP_STAT_BYTES] += o->size;
    cfg_count(m, o, 1);
    m->stats[KVP_STAT_PUTS]++;
    m->stats[KVP_STAT_PUT_BYTES] += o->size;
    if (o->blk)
        kvp_kvblk_sync(m->kb, o, parent, has_parent); /* BlockStored with its parent */
    journal_pub(m, o);
    return 0;
}

static int32_t do_put_revoke(req *q, kvp_obj *o, uint64_t arg, int force)
{
    (void)arg, (void)force;
    if (!o)
        return KVP_EOBJECT_NOT_FOUND;
    if (o->state == KVP_OBJ_COMPLETE)
        return KVP_EINVALID_PARAMS; /* published: use REMOVE */
    if (o->aux != q->s->client->slot)
        return KVP_EILLEGAL_CLIENT;
    obj_destroy(q->m, o, GONE_REVOKED);
    return 0;
}

static int32_t do_release(req *q, kvp_obj *o, uint64_t lease_id, int force)
{
    kvp_master *m = q->m;
    (void)force;
    if (!o || o->state != KVP_OBJ_COMPLETE)
        return KVP_EOBJECT_NOT_FOUND;
    if (o->aux == 0 || o->lease_seq != lease_id)
        return KVP_ELEASE_EXPIRED; /* expired, or not this object's */
    /* a lease of the current epoch keeps the object on the leased list */
    KVP_ASSERT(o->list == KVP_LIST_LEASED && m->stats[KVP_STAT_LEASES] > 0);
    /* a lease id names the epoch, not the holder: what ends is a GET's
     * lease unless only holds are left (a lookup's client released one) */
    uint32_t n = lease_count(o) - 1, h = lease_holds(o);
    lease_set(o, n, h < n ? h : n);
    m->stats[KVP_STAT_LEASES]--;
    if (o->aux == 0) {
        list_unlink(m, o);
        settle_unleased(m, o);
    }
    return 0;
}

static int32_t do_remove(req *q, kvp_obj *o, uint64_t arg, int force)
{
    (void)arg;
    if (!o)
        return KVP_EOBJECT_NOT_FOUND;
    if (o->state != KVP_OBJ_COMPLETE)
        return KVP_EREPLICA_IS_NOT_READY;
    if (!force && is_leased(o, q->now))
        return KVP_EOBJECT_HAS_LEASE;
    if (!force && (o->flags & KVP_OBJ_PINNED))
        return KVP_EOBJECT_PINNED;
    obj_destroy(q->m, o, GONE_REMOVED);
    return 0;
}

/*
 * REPLICA_BAD (ONEWAY): a reader's checksum did not match. The replica named
 * (segment and generation: still the allocation the reader was given) is
 * dropped; an object with no replica left is removed, so the key can be put
 * again instead of being stuck behind a corrupt copy. A ONEWAY one is
 * answered only when the body cannot be decoded; one sent as a request is
 * answered (0, or the tenant refusal).
 */
static void op_replica_bad(req *q)
{
    kvp_master *m = q->m;
    kvp_msg_replica_bad d;
    if (kvp_dec_replica_bad(q->body, q->h->body_len, &m->lim, q->a, &d)) {
        reply_status(q, KVP_EPROTOCOL);
        return;
    }
    int oneway = (q->h->flags & KVP_FLAG_ONEWAY) != 0;
    int tenant = tenant_allowed(m, q->s->client, d.tenant) ? -1 : tenant_find(m, d.tenant);
    if (tenant < 0) {
        if (!oneway) /* sent as a request: it gets an answer */
            reply_status(q, tenant_allowed(m, q->s->client, d.tenant));
        return;
    }
    for (uint32_t i = 0; i < d.n; i++) {
        kvp_bytes k = d.bad[i].key;
        if (!key_ok(m, k))
            continue;
        uint64_t h = kvp_index_hash((uint16_t)tenant, k.p, k.len);
        kvp_obj *o = kvp_index_find(&m->ix, h, (uint16_t)tenant, k.p, k.len);
        if (!o || o->state != KVP_OBJ_COMPLETE)
            continue;
        kvp_orep *r = kvp_obj_reps(o);
        unsigned j;
        for (j = 0; j < o->nrep; j++) {
            const kvp_mseg *sg = m->segs[r[j].seg];
            if (sg->id == d.bad[i].segment_id && wire_gen(sg, r[j].gen) == d.bad[i].generation)
                break;
        }
        if (j == o->nrep)
            continue; /* already dropped, or another allocation by now */
        m->stats[KVP_STAT_BAD_REPLICAS]++;
        KVP_WARN(MOD, "replica of a %llu-byte object on segment %016llx reported corrupt: %s",
                 (unsigned long long)o->size, (unsigned long long)d.bad[i].segment_id,
                 o->nrep == 1 ? "object removed" : "replica dropped");
        if (o->nrep == 1) {
            obj_destroy(m, o, GONE_REMOVED);
            continue;
        }
        KVP_ASSERT(o->nrep > 1);
        if (o->list == KVP_LIST_LRU) {
            KVP_ASSERT(m->segs[r[j].seg]->lru_pages >= kvp_pages(o->size));
            m->segs[r[j].seg]->lru_pages -= kvp_pages(o->size);
        }
        free_replica(m, o, &r[j]);
        tenant_pages(m, o, -1);
        memmove(&r[j], &r[j + 1], (o->nrep - j - 1) * sizeof *r);
        o->nrep--;
        journal_pub(m, o);
    }
    if (!oneway)
        reply_status(q, 0);
}

/*
 * SEG_FAILING (ONEWAY): a client's transfers to these segments failed (a
 * dead node, a broken network path). No new replica is placed there until
 * the owner's next HEARTBEAT shows it alive, so puts go to live segments
 * instead of failing one after another.
 */
static void op_seg_failing(req *q)
{
    kvp_master *m = q->m;
    kvp_msg_ids d;
    if (kvp_dec_ids(q->body, q->h->body_len, &m->lim, q->a, &d)) {
        reply_status(q, KVP_EPROTOCOL);
        return;
    }
    for (uint32_t i = 0; i < d.n; i++) {
        int si = seg_find_id(m, d.ids[i]);
        if (si < 0 || m->segs[si]->suspect)
            continue;
        m->segs[si]->suspect = 1;
        m->nsuspect++;
        KVP_WARN_LIMITED(MOD, "segment %016llx (%s) reported failing by %s: no placement "
                              "there until its node heartbeats",
                         (unsigned long long)d.ids[i], m->segs[si]->name, q->s->client->name);
    }
    if (!(q->h->flags & KVP_FLAG_ONEWAY)) /* sent as a request: it gets an answer */
        reply_status(q, 0);
}

static void op_put_end(req *q)
{
    kvp_msg_put_end d;
    if (kvp_dec_put_end(q->body, q->h->body_len, &q->m->lim, q->a, &d))
        reply_status(q, KVP_EPROTOCOL);
    else
        keyed_op(q, d.tenant, d.n, d.keys, d.checksums, 0, 1, do_put_end);
}

static void op_put_revoke(req *q)
{
    kvp_msg_keys d;
    if (kvp_dec_keys(q->body, q->h->body_len, &q->m->lim, q->a, &d))
        reply_status(q, KVP_EPROTOCOL);
    else
        keyed_op(q, d.tenant, d.n, d.keys, NULL, 0, 1, do_put_revoke);
}

/* RELEASE: same body as PUT_END, the u64 being the lease id from GET. A
 * one-way RELEASE is answered only when it cannot be decoded. */
static void op_release(req *q)
{
    kvp_msg_put_end d;
    if (kvp_dec_put_end(q->body, q->h->body_len, &q->m->lim, q->a, &d))
        reply_status(q, KVP_EPROTOCOL);
    else
        keyed_op(q, d.tenant, d.n, d.keys, d.checksums, 0, !(q->h->flags & KVP_FLAG_ONEWAY),
                 do_release);
}

static void op_remove(req *q)
{
    kvp_msg_remove d;
    if (kvp_dec_remove(q->body, q->h->body_len, &q->m->lim, q->a, &d))
        reply_status(q, KVP_EPROTOCOL);
    else
        keyed_op(q, d.tenant, d.n, d.keys, NULL, d.force, 1, do_remove);
}


/*
 * A GET of an object only on disk: a staging allocation on the disk node's
 * segment (evicting there if needed, at most LOAD_EVICT_MAX victims), and a
 * LOAD command; the node fills it and reports LOADED, and from then on the
 * object is read like any other, from DRAM (the copy stays there: it is the
 * promotion, and evicting it later costs no write). Loads in flight may
 * stage at most 1/LOAD_SHARE of the segment. The answer for now is
 * OBJECT_LOADING: the client asks again shortly.
 */
/* Room in m->quar for every load in flight (each may end in quarantine;
 * loads are on the diskio list) and one more: so quarantine never has to
 * allocate, and cannot lose track of staging pages. 0 or KVP_ENOMEM. */
static int quar_reserve(kvp_master *m)
{
    uint64_t need = (uint64_t)m->nquar + m->diskio.n + 1;
    if (need <= m->quar_cap)
        return 0;
    uint64_t cap = m->quar_cap ? m->quar_cap : 16;
    while (cap < need)
        cap *= 2;
    quar *q = cap <= UINT32_MAX ? kvp_realloc(m->quar, (size_t)cap * sizeof *q) : NULL;
    if (!q)
        return KVP_ENOMEM;
    m->quar = q;
    m->quar_cap = (uint32_t)cap;
    return 0;
}

static int32_t load_start(kvp_master *m, kvp_obj *o)
{
    KVP_ASSERT(o->list == KVP_LIST_DISK && o->nrep == 0 && o->rep_cap >= 1);
    uint32_t si = o->disk_seg;
    kvp_mseg *s = m->segs[si];
    uint32_t np = kvp_pages(o->size);
    if (!disk_can_send(m, si) ||
        (s->load_pages > 0 && s->load_pages + np > (s->capacity >> 12) / LOAD_SHARE))
        return KVP_EOBJECT_LOADING; /* the node is busy or away: ask again */
    if (quar_reserve(m))
        return KVP_ENOMEM;
    kvp_orep rep;
    uint32_t freed[KVP_MAX_REPLICAS];
    int rc = try_alloc(m, si, np, &rep);
    uint64_t before = s->spill_pages;
    for (int k = 0; rc == KVP_ENO_AVAILABLE_HANDLE && k < LOAD_EVICT_MAX; k++) {
        int nf = evict_one(m, victim(m, o->tenant, 1.0, 1), freed, 1);
        if (nf < 0 || s->spill_pages - before >= np)
            break; /* nothing to evict, or enough on its way to disk */
        for (int i = 0; i < nf; i++)
            if (freed[i] == si) {
                rc = try_alloc(m, si, np, &rep);
                break;
            }
    }
    if (rc)
        return rc == KVP_ENOMEM ? KVP_ENOMEM : KVP_EOBJECT_LOADING;
    list_unlink(m, o);
    kvp_obj_reps(o)[0] = rep;
    o->nrep = 1;
    tenant_pages(m, o, +1);
    o->flags |= KVP_OBJ_LOADING;
    s->load_pages += np;
    disk_cmd(m, si, KVP_DISK_LOAD, o, rep.page, wire_gen(s, rep.gen));
    settle_unleased(m, o);
    m->stats[KVP_STAT_DISK_HITS]++;
    return KVP_EOBJECT_LOADING;
}

/* ------------------------------------------------------- DISK_REPORT */

static int has_replica_gen(const kvp_master *m, kvp_obj *o, uint32_t si, uint64_t gen)
{
    const kvp_orep *r = kvp_obj_reps(o);
    for (unsigned k = 0; k < o->nrep; k++)
        if (r[k].seg == si && wire_gen(m->segs[si], r[k].gen) == gen)
            return 1;
    return 0;
}

/* Tells slot si's node to remove the record a report named (e->rec), and
 * only it. */
static void forget_ent(kvp_master *m, uint32_t si, const kvp_disk_ent *e)
{
    kvp_disk_ent f = {KVP_DISK_FORGET, 0, e->tenant, e->key, e->size, e->checksum, 0, 0, e->rec};
    disk_cmd_ent(m, si, &f);
}

/* Is record a newer than record b of the same node (serial arithmetic on
 * the 32-bit ids: a node numbers its records in order)? */
static int rec_newer(uint32_t a, uint32_t b) { return (int32_t)(a - b) > 0; }

/* Ends o's spill to slot si's node with status (0: its record is rec). */
static void spill_done(kvp_master *m, kvp_obj *o, uint32_t si, int32_t status, uint32_t rec)
{
    kvp_mseg *s = m->segs[si];
    uint32_t np = kvp_pages(o->size);
    KVP_ASSERT(s->spill_pages >= np && m->spill_total >= np && m->stats[KVP_STAT_SPILLING] > 0);
    s->spill_pages -= np;
    m->spill_total -= np;
    m->stats[KVP_STAT_SPILLING]--;
    o->flags &= (uint8_t)~KVP_OBJ_SPILLING;
    if (status == 0) {
        m->stats[KVP_STAT_SPILLS]++;
        disk_adopt(m, o, si, rec);
        if (o->list == KVP_LIST_DISKIO)
            drop_dram(m, o);
        return;
    }
    m->stats[KVP_STAT_SPILL_FAILS]++;
    KVP_DEBUG(MOD, "spill of a %llu-byte object to segment %016llx failed: %s",
              (unsigned long long)o->size, (unsigned long long)s->id, kvp_strerror(status));
    if (o->list == KVP_LIST_DISKIO)
        obj_destroy(m, o, GONE_EVICTED);
}

/* A spill finished: durable (the DRAM copies go, unless a reader holds a
 * lease: then they stay until it ends) or failed (the victim is dropped,
 * as it would have been without a disk tier). A record of an object that
 * is gone, or is another value by now, is forgotten. */
static void rep_spilled(kvp_master *m, uint32_t si, kvp_obj *o, const kvp_disk_ent *e)
{
    if (!o || o->state != KVP_OBJ_COMPLETE || !(o->flags & KVP_OBJ_SPILLING) ||
        o->disk_seg != si || o->checksum != e->checksum || o->size != e->size ||
        !has_replica_gen(m, o, si, e->generation)) {
        /* the value the master knows on that node already (a HAVE got there
         * first): the node keeps the newest record of a key, so that is
         * the one to name from now on; any other record is forgotten (by
         * its id: a newer record of the key stays) */
        int known = o && (o->flags & KVP_OBJ_ONDISK) && o->disk_seg == si &&
                    o->checksum == e->checksum && o->size == e->size;
        if (e->status == 0 && known && rec_newer(e->rec, o->disk_rec))
            o->disk_rec = e->rec;
        else if (e->status == 0 && !known)
            forget_ent(m, si, e);
        return;
    }
    spill_done(m, o, si, e->status, e->rec);
}

/*
 * A node that has not answered a spill or a load within put_timeout (its
 * command or report was lost with a connection, or it is stuck): the spill
 * is abandoned (the object stays in DRAM, evictable again); the load's
 * staging allocation is held until the node reports it or goes (it may
 * still be writing there) and the object is on disk only again.
 */
static void disk_timeout(kvp_master *m, kvp_obj *o)
{
    uint32_t si = o->disk_seg;
    kvp_mseg *s = m->segs[si];
    uint32_t np = kvp_pages(o->size);
    KVP_WARN(MOD, "segment %016llx did not answer a %s of a %llu-byte object in %llu ms",
             (unsigned long long)s->id, (o->flags & KVP_OBJ_SPILLING) ? "spill" : "load",
             (unsigned long long)o->size, (unsigned long long)m->cfg.put_timeout_ms);
    list_unlink(m, o);
    if (o->flags & KVP_OBJ_SPILLING) {
        s->spill_pages -= np;
        m->spill_total -= np;
        m->stats[KVP_STAT_SPILLING]--;
        m->stats[KVP_STAT_SPILL_FAILS]++;
        o->flags &= (uint8_t)~KVP_OBJ_SPILLING;
    } else {
        KVP_ASSERT((o->flags & KVP_OBJ_LOADING) && o->nrep == 1);
        s->load_pages -= np;
        m->stats[KVP_STAT_LOAD_FAILS]++;
        quarantine(m, o, &kvp_obj_reps(o)[0]);
        tenant_pages(m, o, -1);
        o->nrep = 0;
        o->flags &= (uint8_t)~KVP_OBJ_LOADING;
        if (!(o->flags & KVP_OBJ_ONDISK)) { /* its record went meanwhile (GONE): no copy */
            obj_destroy(m, o, GONE_REMOVED);
            return;
        }
    }
    settle_unleased(m, o);
}

static void quar_release(kvp_master *m, uint32_t si, uint64_t gen)
{
    for (uint32_t i = 0; i < m->nquar; i++) {
        quar q = m->quar[i];
        if (q.seg != si || wire_gen(m->segs[si], q.gen) != gen)
            continue;
        m->quar[i] = m->quar[--m->nquar];
        kvp_orep r = {q.seg, q.page, q.gen};
        m->quar_pages -= kvp_pages(q.size);
        free_unexposed(m, &r, q.size);
        return;
    }
}

/* A load finished: the staging copy is the object's DRAM replica now, or
 * it is freed; a record the node could not read (gone, corrupt) takes the
 * object with it -- reported missing, never served. */
static void rep_loaded(kvp_master *m, uint32_t si, kvp_obj *o, const kvp_disk_ent *e)
{
    kvp_mseg *s = m->segs[si];
    if (!o || !(o->flags & KVP_OBJ_LOADING) || o->disk_seg != si ||
        !has_replica_gen(m, o, si, e->generation)) {
        quar_release(m, si, e->generation);
        return;
    }
    uint32_t np = kvp_pages(o->size);
    KVP_ASSERT(o->nrep == 1 && o->list == KVP_LIST_DISKIO && s->load_pages >= np);
    s->load_pages -= np;
    o->flags &= (uint8_t)~KVP_OBJ_LOADING;
    list_unlink(m, o);
    if (e->status == 0) {
        m->stats[KVP_STAT_LOADS]++;
        settle_unleased(m, o);
        journal_pub(m, o);
        return;
    }
    m->stats[KVP_STAT_LOAD_FAILS]++;
    free_replica(m, o, &kvp_obj_reps(o)[0]);
    tenant_pages(m, o, -1);
    o->nrep = 0;
    int32_t st = e->status;
    if (st == KVP_EOBJECT_NOT_FOUND || st == KVP_ECHECKSUM_MISMATCH || st == KVP_EIO ||
        st == KVP_EBUFFER_OVERFLOW || !(o->flags & KVP_OBJ_ONDISK)) {
        KVP_WARN(MOD, "load of a %llu-byte object from segment %016llx failed (%s): removed",
                 (unsigned long long)o->size, (unsigned long long)s->id, kvp_strerror(st));
        obj_destroy(m, o, GONE_REMOVED);
        return;
    }
    settle_unleased(m, o); /* a passing failure: the next GET tries again */
}

/*
 * May the owner of a segment report disk records (HAVE) in tenant t? A
 * HAVE re-creates objects the master cannot check (a restarted node's
 * records), so only a peer that may write t: a holder of the node
 * credential (a trusted storage node) not bound to a tenant, any mounter
 * where no tenant is protected, and a tenant-bound one (an embedded
 * client's segment) only in its own tenant.
 */
static int have_allowed(const kvp_master *m, const kvp_mclient *c, kvp_bytes t)
{
    if (c->tcred >= 0)
        return tenant_allowed(m, c, t) == 0;
    return c->node || m->ntcreds == 0;
}

/* A durable record the node holds (after its mount): the object it is --
 * one the master knows with the same value, or a new one only on disk. */
static void rep_have(kvp_master *m, uint32_t si, kvp_obj *o, const kvp_disk_ent *e)
{
    if (o) {
        if (o->state == KVP_OBJ_COMPLETE && o->checksum == e->checksum && o->size == e->size) {
            if (o->flags & KVP_OBJ_SPILLING) {
                /* durable, its SPILLED lost with a connection: done */
                if (o->disk_seg == si)
                    spill_done(m, o, si, 0, e->rec);
                return;
            }
            if ((o->flags & KVP_OBJ_ONDISK) && o->disk_seg == si) {
                o->disk_rec = e->rec; /* the node's record of the key now */
                return;
            }
            if (o->flags & KVP_OBJ_LOADING)
                return; /* staged from another record; keep that one */
            if ((o->flags & KVP_OBJ_ONDISK) && !owner_gone(m, m->segs[o->disk_seg]))
                return; /* a live node holds it: never shadowed by another's record */
            if (o->flags & KVP_OBJ_ONDISK)
                disk_unadopt(m, o); /* a restarted node took over the record */
            disk_adopt(m, o, si, e->rec);
            m->stats[KVP_STAT_DISK_REGISTERED]++;
            return;
        }
        forget_ent(m, si, e); /* another value under the key (or one being written) */
        return;
    }
    if (e->size == 0 || e->size > m->cfg.max_object_size ||
        (m->cfg.max_objects && m->ix.count >= m->cfg.max_objects) ||
        kvp_mem_used() > m->cfg.max_master_memory)
        return; /* not registered now; the record stays for a later mount */
    int tenant = tenant_get(m, e->tenant);
    if (tenant < 0)
        return;
    kvp_obj *n = NULL;
    if (kvp_index_reserve(&m->ix) == 0)
        n = kvp_salloc(kvp_obj_bytes((uint16_t)e->key.len, 1, 0));
    if (!n) {
        tenant_release_if_empty(m, tenant);
        return;
    }
    memset(n, 0, sizeof *n);
    n->size = e->size;
    n->checksum = e->checksum;
    n->tenant = (uint16_t)tenant;
    n->keylen = (uint16_t)e->key.len;
    n->state = KVP_OBJ_COMPLETE;
    n->rep_cap = 1;
    n->lease_seq = ++m->lease_seq;
    memcpy((uint8_t *)(n + 1), e->key.p, e->key.len);
    kvp_index_insert(&m->ix, kvp_index_hash((uint16_t)tenant, e->key.p, e->key.len), n);
    m->tenant_nobj[tenant]++;
    m->tq[tenant].bytes += n->size;
    m->stats[KVP_STAT_OBJECTS]++;
    m->stats[KVP_STAT_BYTES] += n->size;
    cfg_count(m, n, 1);
    m->stats[KVP_STAT_DISK_REGISTERED]++;
    disk_adopt(m, n, si, e->rec);
    settle_unleased(m, n);
}

/* The tier dropped a record (for room, or corrupt): an object left with no
 * copy is gone. An older record of the key than the object's is not its
 * (a newer one is: it had replaced the object's on the node). */
static void rep_gone(kvp_master *m, uint32_t si, kvp_obj *o, const kvp_disk_ent *e)
{
    if (!o || !(o->flags & KVP_OBJ_ONDISK) || o->disk_seg != si || o->checksum != e->checksum ||
        rec_newer(o->disk_rec, e->rec))
        return;
    m->stats[KVP_STAT_DISK_DROPPED]++;
    disk_unadopt(m, o);
    if (o->nrep == 0)
        obj_destroy(m, o, GONE_EVICTED);
    /* a LOADING object learns it from its load's failure */
}

/*
 * DISK_REPORT (ONEWAY, from the node that owns the segment): outcomes of
 * the master's DISK_CMDs and the records the node holds. Answered only when
 * the body cannot be decoded, or when sent as a request.
 */
static void op_disk_report(req *q)
{
    kvp_master *m = q->m;
    kvp_msg_disk d;
    if (kvp_dec_disk(q->body, q->h->body_len, &m->lim, q->a, &d)) {
        reply_status(q, KVP_EPROTOCOL);
        return;
    }
    int oneway = (q->h->flags & KVP_FLAG_ONEWAY) != 0;
    int si = seg_find_id(m, d.segment_id);
    if (si < 0 || m->segs[si]->owner != q->s->client || !m->segs[si]->disk_cap) {
        if (!oneway)
            reply_status(q, si < 0 ? KVP_ESEGMENT_NOT_FOUND : KVP_EILLEGAL_CLIENT);
        return;
    }
    for (uint32_t i = 0; i < d.n && m->segs[si]; i++) {
        const kvp_disk_ent *e = &d.e[i];
        if ((!key_ok(m, e->key) && e->what != KVP_DISK_USAGE) || e->tenant.len > 255)
            continue;
        int tenant = tenant_find(m, e->tenant);
        kvp_obj *o = NULL;
        if (tenant >= 0)
            o = kvp_index_find(&m->ix, kvp_index_hash((uint16_t)tenant, e->key.p, e->key.len),
                               (uint16_t)tenant, e->key.p, e->key.len);
        switch (e->what) {
        case KVP_DISK_SPILLED: rep_spilled(m, (uint32_t)si, o, e); break;
        case KVP_DISK_LOADED: rep_loaded(m, (uint32_t)si, o, e); break;
        case KVP_DISK_HAVE:
            if (have_allowed(m, q->s->client, e->tenant))
                rep_have(m, (uint32_t)si, o, e);
            else
                KVP_WARN_LIMITED(MOD, "DISK_REPORT from client %s: a record in a tenant it may "
                                      "not write ignored", q->s->client->name);
            break;
        case KVP_DISK_GONE: rep_gone(m, (uint32_t)si, o, e); break;
        case KVP_DISK_USAGE: {
            uint64_t *u = m->segs[si]->disk_usage;
            u[0] = e->size, u[1] = e->checksum, u[2] = e->generation, u[3] = e->page;
            break;
        }
        default: break; /* commands are not reports */
        }
    }
    if (!oneway)
        reply_status(q, 0);
}

static void op_get(req *q)
{
    kvp_master *m = q->m;
    kvp_msg_keys d;
    if (kvp_dec_keys(q->body, q->h->body_len, &m->lim, q->a, &d)) {
        reply_status(q, KVP_EPROTOCOL);
        return;
    }
    if (!fits(q, d.n, 40 + KVP_SEG_IO_SIZE * KVP_MAX_REPLICAS)) {
        reply_status(q, KVP_ETOO_LARGE);
        return;
    }
    int rc = tenant_allowed(m, q->s->client, d.tenant);
    if (rc) {
        reply_status(q, rc);
        return;
    }
    int tenant = tenant_find(m, d.tenant);
    /* room for the whole answer before any hold is granted: a hold must never
     * be granted for an answer that cannot be sent */
    if (kvp_buf_reserve(q->out, 64 + (size_t)d.n * KVP_XL_ENT_SIZE) != 0) {
        reply_status(q, KVP_ENOMEM);
        return;
    }
    lk l;
    lk_init(&l, m, tenant, d.keys, d.n);
    size_t off = reply_begin(q);
    kvp_buf_u32(q->out, (uint32_t)m->cfg.lease_ttl_ms);
    kvp_buf_u32(q->out, d.n);
    for (uint32_t i = 0; i < d.n; i++) {
        kvp_get_result r = {0};
        kvp_obj *o = lk_next(&l);
        if (!o || o->state != KVP_OBJ_COMPLETE) {
            r.status = o ? KVP_EREPLICA_IS_NOT_READY : KVP_EOBJECT_NOT_FOUND;
            m->stats[KVP_STAT_MISSES]++;
        } else if (o->flags & KVP_OBJ_LOADING) {
            r.status = KVP_EOBJECT_LOADING;
        } else if (o->nrep == 0) {
            r.status = load_start(m, o);
        } else {
            r.status = 0;
        }
        if (r.status == KVP_EOBJECT_LOADING) { /* what is known without the bytes */
            r.size = o->size;
            r.checksum = o->checksum;
        } else if (r.status == 0) {
            lease_grant(m, o, q->now, LEASE_GET);
            m->stats[KVP_STAT_HITS]++;
            m->stats[KVP_STAT_HIT_BYTES] += o->size;
            r.size = o->size;
            r.checksum = o->checksum;
            r.lease_id = o->lease_seq;
            r.n_replicas = describe(m, kvp_obj_reps(o), o->nrep, o->size, KVP_ACCESS_READ,
                                    q->now + m->cfg.lease_ttl_ms, r.replicas);
            uint32_t until = ms32(q->now + m->cfg.lease_ttl_ms);
            if (!(o->flags & KVP_OBJ_READ) || after(until, o->exposed))
                o->exposed = until;
            o->flags |= KVP_OBJ_READ;
        }
        kvp_enc_get_result(q->out, &r);
    }
    reply_end(q, off);
}

/* EXIST (mode 0), PREFIX (1), TIERS (2). */
static void op_exist(req *q, int prefix)
{
    kvp_master *m = q->m;
    kvp_msg_keys d;
    if (kvp_dec_keys(q->body, q->h->body_len, &m->lim, q->a, &d)) {
        reply_status(q, KVP_EPROTOCOL);
        return;
    }
    int rc = tenant_allowed(m, q->s->client, d.tenant);
    if (rc) {
        reply_status(q, rc);
        return;
    }
    int tenant = tenant_find(m, d.tenant);
    lk l;
    lk_init(&l, m, tenant, d.keys, d.n);
    if (prefix == 1) {
        uint32_t n = 0;
        while (n < d.n) {
            kvp_obj *o = lk_next(&l);
            if (!o || o->state != KVP_OBJ_COMPLETE)
                break;
            n++;
        }
        kvp_msg_prefix_resp r = {n};
        size_t off = reply_begin(q);
        kvp_enc_prefix_resp(q->out, &r);
        reply_end(q, off);
        return;
    }
    size_t off = reply_begin(q);
    kvp_buf_u32(q->out, d.n);
    if (kvp_buf_reserve(q->out, (size_t)d.n * 4) == 0) {
        uint8_t *p = q->out->data + q->out->len;
        for (uint32_t i = 0; i < d.n; i++) {
            kvp_obj *o = lk_next(&l);
            uint32_t v = o && o->state == KVP_OBJ_COMPLETE;
            if (v && prefix == 2)
                v = (o->nrep > 0 && !(o->flags & KVP_OBJ_LOADING) ? KVP_TIER_DRAM : 0) |
                    ((o->flags & KVP_OBJ_ONDISK) ? KVP_TIER_DISK : 0);
            p[4 * i] = (uint8_t)v;
            p[4 * i + 1] = p[4 * i + 2] = p[4 * i + 3] = 0;
        }
        q->out->len += (size_t)d.n * 4;
    }
    reply_end(q, off);
}

/*
 * EXIST_LEASE (proto.h): EXIST that holds what it answered. A key whose
 * object is complete with a readable DRAM replica (what GET would lease
 * without staging) gets a lookup hold: a lease like GET's -- counted in
 * o->aux, the deadline now + lease_ttl for every lease of the object, the
 * same lease id -- marked as a hold, which the next GET of the object takes
 * over (see "leases"). So eviction, background eviction and a REMOVE
 * without force skip the object until that GET's RELEASE, or until its
 * leases expire (lease_expire_all at the deadline, whatever the count). A
 * put with F_REPLACE is not held back (as with GET leases). Disk-only
 * objects are reported with their size and no lease. An answer of 17 bytes
 * per key must fit max_frame (TOO_LARGE, nothing leased).
 */
static void op_exist_lease(req *q)
{
    kvp_master *m = q->m;
    kvp_msg_keys d;
    if (kvp_dec_keys(q->body, q->h->body_len, &m->lim, q->a, &d)) {
        reply_status(q, KVP_EPROTOCOL);
        return;
    }
    if (!fits(q, d.n, KVP_XL_ENT_SIZE)) {
        reply_status(q, KVP_ETOO_LARGE);
        return;
    }
    int rc = tenant_allowed(m, q->s->client, d.tenant);
    if (rc) {
        reply_status(q, rc);
        return;
    }
    int tenant = tenant_find(m, d.tenant);
    /* room for the whole answer before any hold is granted: a hold must never
     * be granted for an answer that cannot be sent */
    if (kvp_buf_reserve(q->out, 64 + (size_t)d.n * KVP_XL_ENT_SIZE) != 0) {
        reply_status(q, KVP_ENOMEM);
        return;
    }
    lk l;
    lk_init(&l, m, tenant, d.keys, d.n);
    size_t off = reply_begin(q);
    kvp_buf_u32(q->out, (uint32_t)m->cfg.lease_ttl_ms);
    kvp_buf_u32(q->out, d.n);
    for (uint32_t i = 0; i < d.n; i++) {
        kvp_obj *o = lk_next(&l);
        kvp_xl_ent e = {KVP_XL_ABSENT, 0, 0};
        if (o && o->state == KVP_OBJ_COMPLETE) {
            e.size = o->size;
            if (o->nrep > 0 && !(o->flags & KVP_OBJ_LOADING)) {
                lease_grant(m, o, q->now, LEASE_LOOKUP);
                e.state = KVP_XL_LEASED;
                e.lease_id = o->lease_seq;
            } else {
                e.state = KVP_XL_DISK;
            }
        }
        kvp_buf_u8(q->out, e.state);
        kvp_buf_u64(q->out, e.size);
        kvp_buf_u64(q->out, e.lease_id);
    }
    reply_end(q, off);
}

/* LOOKUP_HASHES: per chain, the leading blocks in each tier (kvblk.h). */
static void op_lookup_hashes(req *q)
{
    kvp_master *m = q->m;
    kvp_msg_lookup_hashes d;
    if (kvp_dec_lookup_hashes(q->body, q->h->body_len, &m->lim, q->a, &d)) {
        reply_status(q, KVP_EPROTOCOL);
        return;
    }
    int rc = tenant_allowed(m, q->s->client, d.tenant);
    if (rc) {
        reply_status(q, rc);
        return;
    }
    int tenant = tenant_find(m, d.tenant);
    size_t off = reply_begin(q);
    kvp_buf_u32(q->out, d.n);
    for (uint32_t i = 0; i < d.n; i++) {
        kvp_hprefix p = {0};
        if (tenant >= 0)
            kvp_kvblk_lookup(m->kb, (uint16_t)tenant, &d.chains[i], &p);
        kvp_buf_u32(q->out, p.dram);
        kvp_buf_u32(q->out, p.disk);
        kvp_buf_u32(q->out, p.any);
    }
    reply_end(q, off);
}

void kvp_master_lookup(kvp_master *m, const char *tenant, size_t tlen, const kvp_hchain *c,
                       kvp_hprefix *out)
{
    int t = tlen <= UINT16_MAX ? tenant_find(m, (kvp_bytes){(const uint8_t *)tenant, (uint32_t)tlen})
                               : -1;
    memset(out, 0, sizeof *out);
    if (t >= 0)
        kvp_kvblk_lookup(m->kb, (uint16_t)t, c, out);
}

static void snap_put(void *ctx, uint64_t hash, uint8_t group, uint8_t tier)
{
    kvp_buf *b = ctx;
    kvp_buf_u64(b, hash);
    kvp_buf_u8(b, group);
    kvp_buf_u8(b, tier);
}

/* KV_SNAPSHOT: the tenant's announced blocks as of its stream's last batch
 * (its open events are closed into a batch first, so the answer's seq
 * covers everything it reflects). An answer over max_frame is TOO_LARGE. */
static void op_kv_snapshot(req *q)
{
    kvp_master *m = q->m;
    kvp_msg_keys d;
    if (kvp_dec_keys(q->body, q->h->body_len, &m->lim, q->a, &d) || d.n != 0) {
        reply_status(q, KVP_EPROTOCOL);
        return;
    }
    int rc = tenant_allowed(m, q->s->client, d.tenant);
    if (rc) {
        reply_status(q, rc);
        return;
    }
    int tenant = tenant_find(m, d.tenant);
    uint64_t seq = tenant >= 0 ? kvp_kvblk_close(m->kb, (uint16_t)tenant, wall_us()) : 0;
    size_t off = reply_begin(q);
    kvp_buf_u64(q->out, seq);
    size_t at = q->out->len;
    kvp_buf_u32(q->out, 0);
    uint64_t n = tenant >= 0 ? kvp_kvblk_snapshot(m->kb, (uint16_t)tenant, snap_put, q->out) : 0;
    if (!q->out->err && n <= UINT32_MAX) {
        uint32_t n32 = (uint32_t)n;
        for (int i = 0; i < 4; i++)
            q->out->data[at + (size_t)i] = (uint8_t)(n32 >> (8 * i));
    } else if (!q->out->err) {
        q->out->err = KVP_ETOO_LARGE;
    }
    reply_end(q, off);
}


/*
 * REMOVE_ALL and REMOVE_REGEX scan the whole index, so they run as jobs:
 * a FIFO of them, the head one advanced by kvp_master_jobs for a work
 * budget per loop turn (JOB_BUDGET units, about a microsecond each: slots
 * visited, key bytes matched, objects destroyed), so other connections are
 * served in between; the asker's session is `deferred` (the service serves
 * none of its later frames) until the answer is appended. A job that
 * finishes within its first budget is answered at once, as before.
 *
 * What is removed: every object of the tenant that is COMPLETE, not leased
 * nor pinned (unless force) and matching when the scan examines it; the
 * index scan (kvp_index_scan) sees every object present from the start to
 * the end at least once, across growths and backward shifts; objects put
 * meanwhile may or may not be removed. A key being matched is copied (its
 * object may go between turns) and looked up again before removal. The
 * tenant is pinned (tenant_nobj) so its id is not reused while the job
 * lives. The pattern is compiled by src/master/ere.c: linear time, bounded
 * memory, resumable at any byte.
 */
#define JOB_BUDGET (1u << 20) /* work units per job turn: about 1 ms */
#define JOB_DESTROY_COST 256  /* units charged per object removed */

struct rjob {
    rjob *next;
    kvp_msess *s;       /* the asker */
    uint16_t op;
    uint64_t req_id;
    int tenant;
    int force;
    uint32_t patlen;    /* 0: REMOVE_ALL */
    char pat[KVP_REGEX_MAX + 1];
    int started;
    kvp_ere *re;
    kvp_index_scan scan;
    int matching;       /* key[0..keylen) is being matched (run) */
    kvp_ere_run run;
    uint32_t keylen;
    uint8_t *key;       /* max_key bytes */
    uint64_t n;         /* removed so far */
};

static int removable(const rjob *j, const kvp_obj *o, uint64_t now)
{
    if (o->tenant != j->tenant || o->state != KVP_OBJ_COMPLETE)
        return 0;
    return j->force || !(is_leased(o, now) || (o->flags & KVP_OBJ_PINNED));
}

static void job_free(kvp_master *m, rjob *j)
{
    if (j->started)
        kvp_index_scan_stop(&m->ix, &j->scan);
    kvp_ere_free(j->re);
    kvp_free(j->key);
    KVP_ASSERT(m->tenant_nobj[j->tenant] > 0);
    m->tenant_nobj[j->tenant]--;
    tenant_release_if_empty(m, j->tenant);
    kvp_free(j);
}

/* The removal of the matched key, if its object (maybe another one by now,
 * put meanwhile) is still there and removable. */
static void job_remove_key(kvp_master *m, rjob *j, uint64_t now, uint64_t *budget)
{
    uint64_t h = kvp_index_hash((uint16_t)j->tenant, j->key, j->keylen);
    kvp_obj *o = kvp_index_find(&m->ix, h, (uint16_t)j->tenant, j->key, j->keylen);
    if (o && removable(j, o, now)) {
        obj_destroy(m, o, GONE_REMOVED);
        j->n++;
        *budget = *budget > JOB_DESTROY_COST ? *budget - JOB_DESTROY_COST : 0;
    }
}

/* Advances j by about *budget units. 1 when it is done, 0 when the budget
 * ran out first, or KVP_ENOMEM (the pattern could not be compiled). */
static int job_run(kvp_master *m, rjob *j, uint64_t now, uint64_t *budget)
{
    if (!j->started) {
        if (j->patlen) {
            j->key = kvp_malloc(m->cfg.max_key ? m->cfg.max_key : 1);
            if (!j->key || kvp_ere_compile(j->pat, j->patlen, &j->re) != 0)
                return KVP_ENOMEM; /* it compiled when it was queued */
        }
        kvp_index_scan_start(&m->ix, &j->scan);
        j->started = 1;
    }
    while (*budget > 0) {
        if (j->matching) {
            int rc = kvp_ere_search(j->re, &j->run, j->key, j->keylen, budget);
            if (rc == KVP_ERE_MORE)
                return 0;
            j->matching = 0;
            if (rc == KVP_ERE_MATCH)
                job_remove_key(m, j, now, budget);
            continue;
        }
        kvp_obj *o = kvp_index_scan_next(&m->ix, &j->scan, budget);
        if (!o) {
            /* a REMOVE_ALL that left nothing announced: AllBlocksCleared */
            if (j->scan.done && !j->patlen && kvp_kvblk_announced(m->kb, (uint16_t)j->tenant) == 0)
                kvp_kvblk_cleared(m->kb, (uint16_t)j->tenant);
            return j->scan.done;
        }
        if (!removable(j, o, now))
            continue;
        if (!j->re) {
            obj_destroy(m, o, GONE_REMOVED); /* the scan re-examines its slot */
            j->n++;
            *budget = *budget > JOB_DESTROY_COST ? *budget - JOB_DESTROY_COST : 0;
            continue;
        }
        KVP_ASSERT(o->keylen <= m->cfg.max_key);
        memcpy(j->key, kvp_obj_key(o), o->keylen);
        j->keylen = o->keylen;
        kvp_ere_run_init(&j->run);
        j->matching = 1;
    }
    return 0;
}

static void job_answer(rjob *j, int status, kvp_buf *out)
{
    const char *what = j->patlen ? "REMOVE_REGEX" : "REMOVE_ALL";
    size_t off = kvp_frame_begin(out, j->op, KVP_FLAG_RESPONSE, j->req_id, status);
    if (status == 0) {
        KVP_INFO(MOD, "%s%s: %llu objects removed", what, j->force ? " (force)" : "",
                 (unsigned long long)j->n);
        kvp_msg_remove_all_resp r = {j->n};
        kvp_enc_remove_all_resp(out, &r);
    }
    kvp_frame_end(out, off);
}

/* Queues a job for q (tenant found, allowed; pat NULL for REMOVE_ALL) and
 * runs it at once when nothing is ahead of it: answered now if it finishes
 * within one budget, else the session is deferred. */
static void job_submit(req *q, int tenant, int force, const char *pat, uint32_t patlen)
{
    kvp_master *m = q->m;
    rjob *j = kvp_calloc(1, sizeof *j);
    if (!j) {
        reply_status(q, KVP_ENOMEM);
        return;
    }
    j->s = q->s;
    j->op = q->h->op;
    j->req_id = q->h->req_id;
    j->tenant = tenant;
    j->force = force;
    j->patlen = patlen;
    if (patlen)
        memcpy(j->pat, pat, patlen);
    m->tenant_nobj[tenant]++; /* pinned while the job lives */
    if (!m->jobs) {
        uint64_t budget = JOB_BUDGET;
        int rc = job_run(m, j, q->now, &budget);
        if (rc != 0) {
            job_answer(j, rc < 0 ? rc : 0, q->out);
            job_free(m, j);
            return;
        }
    }
    *(m->jobs ? &m->jobs_tail->next : &m->jobs) = j;
    m->jobs_tail = j;
    q->s->deferred = 1;
}

int kvp_master_jobs(kvp_master *m, uint64_t now_ms, kvp_buf *(*out_for)(kvp_msess *s, void *ctx),
                    void *ctx)
{
    m->now = now_ms;
    uint64_t budget = JOB_BUDGET;
    while (m->jobs && budget > 0) {
        rjob *j = m->jobs;
        int rc = job_run(m, j, now_ms, &budget);
        if (rc == 0)
            break;
        m->jobs = j->next;
        j->s->deferred = 0;
        kvp_buf *out = out_for(j->s, ctx);
        if (out)
            job_answer(j, rc < 0 ? rc : 0, out);
        job_free(m, j);
    }
    return m->jobs != NULL;
}

/* The session's job goes (its connection closed). */
static void job_cancel(kvp_master *m, kvp_msess *s)
{
    for (rjob **pp = &m->jobs, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->next) {
        rjob *j = *pp;
        if (j->s != s)
            continue;
        *pp = j->next;
        if (m->jobs_tail == j)
            m->jobs_tail = prev;
        job_free(m, j);
        break;
    }
    s->deferred = 0;
}

static void op_remove_all(req *q)
{
    kvp_master *m = q->m;
    kvp_msg_remove_all d;
    if (kvp_dec_remove_all(q->body, q->h->body_len, &m->lim, &d)) {
        reply_status(q, KVP_EPROTOCOL);
        return;
    }
    int rc = tenant_allowed(m, q->s->client, d.tenant);
    if (rc) {
        reply_status(q, rc);
        return;
    }
    int tenant = tenant_find(m, d.tenant);
    if (tenant < 0) {
        kvp_msg_remove_all_resp r = {0};
        size_t off = reply_begin(q);
        kvp_enc_remove_all_resp(q->out, &r);
        reply_end(q, off);
        return;
    }
    job_submit(q, tenant, d.force, NULL, 0);
}

/* Mooncake's remove_by_regex: a POSIX extended regex searched anywhere in
 * the key; the same rules as REMOVE_ALL for leased and pinned objects.
 * Matched by src/master/ere.c (linear time; it refuses counted repetition
 * and back-references, see ere.h). */
static void op_remove_regex(req *q)
{
    kvp_master *m = q->m;
    kvp_msg_remove_regex d;
    if (kvp_dec_remove_regex(q->body, q->h->body_len, &m->lim, &d)) {
        reply_status(q, KVP_EPROTOCOL);
        return;
    }
    int rc = tenant_allowed(m, q->s->client, d.tenant);
    if (rc) {
        reply_status(q, rc);
        return;
    }
    if (d.pattern.len == 0 || d.pattern.len > KVP_REGEX_MAX) {
        reply_status(q, KVP_EINVALID_PARAMS);
        return;
    }
    /* compiled once here to refuse bad patterns at once; again when run */
    kvp_ere *re;
    rc = kvp_ere_compile((const char *)d.pattern.p, d.pattern.len, &re);
    if (rc) {
        reply_status(q, rc);
        return;
    }
    kvp_ere_free(re);
    int tenant = tenant_find(m, d.tenant);
    if (tenant < 0) {
        kvp_msg_remove_all_resp r = {0};
        size_t off = reply_begin(q);
        kvp_enc_remove_all_resp(q->out, &r);
        reply_end(q, off);
        return;
    }
    job_submit(q, tenant, d.force, (const char *)d.pattern.p, d.pattern.len);
}

static void op_stats(req *q)
{
    kvp_master *m = q->m;
    if (q->h->body_len != 0) {
        reply_status(q, KVP_EPROTOCOL);
        return;
    }
    uint64_t c[KVP_STAT__COUNT];
    kvp_master_stats(m, c);
    kvp_seg_stat *ss = kvp_arena_alloc(q->a, (size_t)m->nseg * sizeof *ss + 1);
    if (!ss) {
        reply_status(q, KVP_ENOMEM);
        return;
    }
    uint32_t n = 0;
    for (uint32_t i = 0; i < m->cfg.max_segments; i++) {
        kvp_mseg *s = m->segs[i];
        if (!s)
            continue;
        ss[n].id = s->id;
        ss[n].name.p = (const uint8_t *)s->name;
        ss[n].name.len = s->namelen;
        ss[n].capacity = s->capacity;
        ss[n].used = s->used_pages << 12;
        ss[n].objects = s->nrep;
        ss[n].largest_free = (uint64_t)kvp_segalloc_largest_free(s->alloc) << 12;
        n++;
    }
    /* tenants: a tenant-bound session sees only its own; others every
     * tenant that exists, in slot order (the configured ones first), up
     * to STATS_TENANTS */
    kvp_tenant_stat *ts = kvp_arena_alloc(q->a, (size_t)STATS_TENANTS * sizeof *ts);
    if (!ts) {
        reply_status(q, KVP_ENOMEM);
        return;
    }
    uint32_t nt = 0;
    const kvp_mclient *cl = q->s->client;
    for (uint32_t i = 0; i < m->ntenants && nt < STATS_TENANTS; i++) {
        if (!m->tenants[i])
            continue;
        kvp_bytes name = {(const uint8_t *)m->tenants[i], m->tenant_len[i]};
        if (cl->tcred >= 0 && tenant_allowed(m, cl, name) != 0)
            continue;
        const mtenant *t = &m->tq[i];
        ts[nt++] = (kvp_tenant_stat){name,         m->tenant_nobj[i], t->bytes,
                                     t->pages << 12, t->max_pages << 12, t->max_objects,
                                     t->evictions, t->refused,        t->share};
    }
    kvp_msg_stats_resp r = {KVP_STAT__COUNT, c, n, ss, nt, ts};
    size_t off = reply_begin(q);
    kvp_enc_stats_resp(q->out, &r);
    reply_end(q, off);
}

/* CONFIGS: the rows with objects, then each tenant's "other"; a
 * tenant-bound session sees its tenant's only (as STATS' tenants). */
static void op_configs(req *q)
{
    kvp_master *m = q->m;
    if (q->h->body_len != 0) {
        reply_status(q, KVP_EPROTOCOL);
        return;
    }
    size_t cap = KVP_CFGTAB_MAX + (size_t)m->ntenants;
    kvp_config_stat *rows = kvp_arena_alloc(q->a, cap * sizeof *rows);
    if (!rows) {
        reply_status(q, KVP_ENOMEM);
        return;
    }
    const kvp_mclient *cl = q->s->client;
    uint32_t n = 0;
    for (uint32_t i = 0; i < KVP_CFGTAB_MAX; i++) {
        const kvp_cfgtab_row *r = kvp_cfgtab_slot(&m->cfgs, i);
        if (!r || !r->objects)
            continue;
        kvp_bytes t = {(const uint8_t *)m->tenants[r->tenant], m->tenant_len[r->tenant]};
        if (cl->tcred >= 0 && tenant_allowed(m, cl, t) != 0)
            continue;
        rows[n++] = (kvp_config_stat){t, {(const uint8_t *)r->name, r->namelen},
                                      {(const uint8_t *)r->fp, r->fplen}, r->objects, r->bytes};
    }
    for (uint32_t i = 0; i < m->ntenants; i++) {
        if (!m->tenants[i] || !m->tq[i].cfg_other[0])
            continue;
        kvp_bytes t = {(const uint8_t *)m->tenants[i], m->tenant_len[i]};
        if (cl->tcred >= 0 && tenant_allowed(m, cl, t) != 0)
            continue;
        rows[n++] = (kvp_config_stat){t, {NULL, 0}, {NULL, 0}, m->tq[i].cfg_other[0],
                                      m->tq[i].cfg_other[1]};
    }
    kvp_msg_configs_resp r = {n, rows};
    size_t off = reply_begin(q);
    kvp_enc_configs_resp(q->out, &r);
    reply_end(q, off);
}

static void op_seg_info(req *q)
{
    kvp_master *m = q->m;
    kvp_msg_ids d;
    if (kvp_dec_ids(q->body, q->h->body_len, &m->lim, q->a, &d)) {
        reply_status(q, KVP_EPROTOCOL);
        return;
    }
    if (!fits(q, d.n, 300 + 64 * 1024 / 64)) {
        reply_status(q, KVP_ETOO_LARGE);
        return;
    }
    size_t off = reply_begin(q);
    kvp_buf_u32(q->out, d.n);
    for (uint32_t i = 0; i < d.n; i++) {
        int si = seg_find_id(m, d.ids[i]);
        if (si < 0) {
            kvp_buf_i32(q->out, KVP_ESEGMENT_NOT_FOUND);
            continue;
        }
        kvp_mseg *s = m->segs[si];
        kvp_buf_i32(q->out, 0);
        kvp_buf_u64(q->out, s->id);
        kvp_buf_bytes(q->out, s->name, s->namelen);
        kvp_buf_u64(q->out, s->capacity);
        kvp_buf_put(q->out, s->endpoints, s->endpoints_len);
    }
    reply_end(q, off);
}

/* ====================================================== cluster replication */

#define PSEG_MAX 65536u                /* segment ids parked objects may name */

/* Changes are journaled while a standby follows or a snapshot file is kept. */
static int journal_on(const kvp_master *m) { return m->nfol || m->cfg.snapshot_file[0]; }

/* Readable with a DRAM copy: what a new leader can take back. */
static int repl_visible(const kvp_obj *o)
{
    return o->state == KVP_OBJ_COMPLETE && !o->replacing && o->nrep > 0 &&
           !(o->flags & KVP_OBJ_LOADING);
}

/* Where o is for lookups and KV events (master/kvblk.h): DRAM when
 * readable with a DRAM copy, disk with a durable record; an object being
 * destroyed is nowhere. */
static unsigned obj_tiers(void *ctx, const kvp_obj *o)
{
    const kvp_master *m = ctx;
    if (o == m->dying)
        return 0;
    unsigned w = repl_visible(o) ? KVP_TIER_DRAM : 0u;
    if (o->state == KVP_OBJ_COMPLETE && !o->replacing && (o->flags & KVP_OBJ_ONDISK))
        w |= KVP_TIER_DISK;
    return w;
}

/* o may have entered or left a tier: KV events (kvblk.h). */
static void blk_sync(kvp_master *m, kvp_obj *o)
{
    if (o->blk && o != m->dying)
        kvp_kvblk_sync(m->kb, o, 0, 0);
}

static const char *tenant_name(void *ctx, uint16_t t, size_t *len)
{
    const kvp_master *m = ctx;
    *len = m->tenant_len[t];
    return m->tenants[t] ? m->tenants[t] : "";
}

uint64_t kvp_master_events_pending(const kvp_master *m) { return kvp_kvblk_pending(m->kb); }

void kvp_master_take_events(kvp_master *m, kvp_kvblk_sink sink, void *ctx)
{
    if (kvp_kvblk_events(m->kb))
        kvp_kvblk_take(m->kb, wall_us(), sink, ctx);
}

/* o's PUB record; a parked object's replicas name their segment by pseg
 * index, a live one's by slot. */
static void repl_rec_fill(const kvp_master *m, const kvp_obj *o, int parked, kvp_repl_rec *r)
{
    memset(r, 0, sizeof *r);
    r->type = KVP_REPL_PUB;
    r->tenant = (kvp_bytes){(const uint8_t *)m->tenants[o->tenant], m->tenant_len[o->tenant]};
    r->key = (kvp_bytes){kvp_obj_key(o), o->keylen};
    r->size = o->size;
    r->checksum = o->checksum;
    r->flags = (o->flags & KVP_OBJ_PINNED) ? KVP_REPL_F_PINNED : 0;
    if (o->blk && kvp_kvblk_group(m->kb, o->tenant, (uint8_t)o->group, &r->parts,
                                  &r->block_size)) {
        r->flags |= KVP_REPL_F_BLOCK;
        r->blk_hash = kvp_obj_blk(o);
        r->group = (uint8_t)o->group;
    }
    r->nrep = o->nrep;
    const kvp_orep *rep = kvp_obj_reps((kvp_obj *)o);
    for (unsigned i = 0; i < o->nrep; i++)
        r->rep[i] = (kvp_repl_rep){parked ? m->pseg[rep[i].seg] : m->segs[rep[i].seg]->id,
                                   rep[i].page, rep[i].gen};
}

/*
 * Snapshots (ha/repl.h: RESET, a PUB per readable object and per parked
 * one, SYNCED) are produced over many loop turns, a work budget at a time,
 * so no turn grows with the index: each holds two resumable index scans
 * (index.h: every entry present from the scan's start to its end is seen
 * at least once, some twice), of the live index then of the parked one.
 *
 * Why a snapshot spread over turns still converges: records are states,
 * and the follower (or the file) gets them in the order they were made.
 * From RESET on it also gets every record journaled (a turn's journal is
 * pushed before that turn's snapshot step, kvp_master_push_repl then
 * kvp_master_push_snaps; only REPL_FOLLOW's first step runs mid-turn,
 * ahead of records journaled earlier in that turn). So for any key, the
 * last record it gets is either the journal record of the key's last
 * change, or a snapshot record made after that change: both tell the
 * key's state now. A key the scan
 * never sees (removed before it got there) has its DEL journaled after
 * RESET, or was absent from the start; a key put after its slot was
 * passed has its PUB journaled. Keys seen twice are written twice:
 * harmless.
 */
struct kvp_msnap {
    int phase;             /* SNAP_LIVE, SNAP_PARKED, SNAP_DONE */
    int scanning;          /* scan is registered with the phase's index */
    kvp_index_scan scan;
    uint64_t n;            /* objects written */
};
enum { SNAP_LIVE, SNAP_PARKED, SNAP_DONE };
#define SNAP_REC_COST 256u /* work units per record written, plus keylen / 8 */

kvp_msnap *kvp_master_snap_start(kvp_master *m, kvp_buf *out)
{
    kvp_msnap *sn = kvp_calloc(1, sizeof *sn);
    if (!sn)
        return NULL;
    kvp_repl_wr_close(&m->jw); /* what is journaled goes after the RESET */
    kvp_repl_wr w = {.out = out};
    kvp_repl_rec r = {.type = KVP_REPL_RESET};
    kvp_repl_wr_add(&w, &r, m->jseq);
    kvp_repl_wr_close(&w);
    kvp_index_scan_start(&m->ix, &sn->scan);
    sn->scanning = 1;
    return sn;
}

/* The index the phase scans (the parked one may not exist yet). */
static kvp_index *snap_index(kvp_master *m, const kvp_msnap *sn)
{
    return sn->phase == SNAP_LIVE ? &m->ix : &m->parked;
}

int kvp_master_snap_step(kvp_master *m, kvp_msnap *sn, kvp_buf *out, uint64_t budget)
{
    kvp_repl_wr w = {.out = out};
    kvp_repl_rec r;
    while (sn->phase != SNAP_DONE && budget >= KVP_INDEX_SLOT_COST && !out->err) {
        kvp_index *ix = snap_index(m, sn);
        kvp_obj *o = sn->scanning ? kvp_index_scan_next(ix, &sn->scan, &budget) : NULL;
        if (o) {
            int parked = sn->phase == SNAP_PARKED;
            if (!parked && !repl_visible(o))
                continue;
            repl_rec_fill(m, o, parked, &r);
            kvp_repl_wr_add(&w, &r, m->jseq);
            sn->n++;
            uint64_t cost = SNAP_REC_COST + o->keylen / 8u;
            budget = budget > cost ? budget - cost : 0;
            continue;
        }
        if (sn->scanning && !sn->scan.done)
            break; /* the budget is spent */
        if (sn->scanning)
            kvp_index_scan_stop(ix, &sn->scan);
        sn->scanning = 0;
        if (sn->phase == SNAP_LIVE) {
            /* objects of a leader before, still waiting for their segment: a
             * standby (or the next restart) must keep waiting for them too */
            sn->phase = SNAP_PARKED;
            if (m->parked.slots) {
                kvp_index_scan_start(&m->parked, &sn->scan);
                sn->scanning = 1;
            }
            continue;
        }
        r = (kvp_repl_rec){.type = KVP_REPL_SYNCED};
        kvp_repl_wr_add(&w, &r, m->jseq);
        sn->phase = SNAP_DONE;
    }
    kvp_repl_wr_close(&w);
    return sn->phase == SNAP_DONE;
}

uint64_t kvp_master_snap_count(const kvp_msnap *sn) { return sn->n; }

void kvp_master_snap_free(kvp_master *m, kvp_msnap *sn)
{
    if (!sn)
        return;
    if (sn->scanning)
        kvp_index_scan_stop(snap_index(m, sn), &sn->scan);
    kvp_free(sn);
}

uint64_t kvp_master_snapshot(kvp_master *m, kvp_buf *out)
{
    kvp_msnap *sn = kvp_master_snap_start(m, out);
    if (!sn) {
        if (!out->err)
            out->err = KVP_ENOMEM;
        return 0;
    }
    while (!kvp_master_snap_step(m, sn, out, UINT64_MAX) && !out->err)
        ;
    uint64_t n = sn->n;
    kvp_master_snap_free(m, sn);
    return n;
}

/* The seq of a record journaled now (m->now): noted in the ring of journal
 * times, which kvp_master_repl_state reads to age what a follower leaves
 * unacknowledged. */
static uint64_t journal_next(kvp_master *m)
{
    uint64_t seq = ++m->jseq;
    if (m->jt_n) {
        const struct jtime *last = &m->jt[(m->jt_head + m->jt_n - 1) % JT_SLOTS];
        if (m->now < last->ms + m->jt_step_ms)
            return seq; /* within the last entry's step */
    }
    if (m->jt_n == JT_SLOTS) { /* the oldest goes: its records are older than ha_sync_timeout */
        m->jt_head = (m->jt_head + 1) % JT_SLOTS;
        m->jt_n--;
    }
    m->jt[(m->jt_head + m->jt_n++) % JT_SLOTS] = (struct jtime){seq, m->now};
    return seq;
}

/* How long the oldest record a follower that acknowledged `acked` lacks
 * has been journaled, at now: 0 when it lacks none. Never less than the
 * truth (it may be up to jt_step_ms more); UINT64_MAX when older than the
 * ring. */
static uint64_t unacked_age(const kvp_master *m, uint64_t acked, uint64_t now)
{
    if (acked >= m->jseq)
        return 0;
    uint64_t first = acked + 1, ms = UINT64_MAX;
    for (uint32_t i = m->jt_n; i-- > 0;) { /* the newest entry at or before first */
        const struct jtime *e = &m->jt[(m->jt_head + i) % JT_SLOTS];
        if (e->seq <= first) {
            ms = e->ms;
            break;
        }
    }
    if (ms == UINT64_MAX)
        return UINT64_MAX;
    return now > ms ? now - ms : 0;
}

/* o is readable (published, loaded back, a replica fewer): journal it. */
static void journal_pub(kvp_master *m, kvp_obj *o)
{
    blk_sync(m, o);
    if (!journal_on(m))
        return;
    if (!repl_visible(o)) {
        journal_del(m, o);
        return;
    }
    kvp_repl_rec r;
    repl_rec_fill(m, o, 0, &r);
    kvp_repl_wr_add(&m->jw, &r, journal_next(m));
}

/* o's key has no DRAM copy any more (removed, evicted, only on disk). */
static void journal_del(kvp_master *m, kvp_obj *o)
{
    blk_sync(m, o);
    if (!journal_on(m) || o->state != KVP_OBJ_COMPLETE || o->replacing)
        return;
    kvp_repl_rec r = {.type = KVP_REPL_DEL,
                      .tenant = {(const uint8_t *)m->tenants[o->tenant], m->tenant_len[o->tenant]},
                      .key = {kvp_obj_key(o), o->keylen}};
    kvp_repl_wr_add(&m->jw, &r, journal_next(m));
}

static struct follower *fol_of(kvp_master *m, const kvp_msess *s)
{
    for (uint32_t i = 0; i < m->nfol; i++)
        if (m->fol[i].s == s)
            return &m->fol[i];
    return NULL;
}

static void fol_remove(kvp_master *m, kvp_msess *s)
{
    struct follower *f = fol_of(m, s);
    if (!f)
        return;
    if (f->in_sync)
        m->fol_in_sync--;
    kvp_master_snap_free(m, f->snap);
    *f = m->fol[--m->nfol];
    s->follower = 0;
    KVP_INFO(MOD, "standby %s stopped following (%u left)", s->peer_addr, m->nfol);
}

/* May this client follow the index (REPL_FOLLOW)? The stream names every
 * key of every tenant: only a master of a cluster (key "etcd" set) streams
 * it, and only to a holder of the node credential (key "node_token"), the
 * credential its standbys present. A standalone master, or a cluster's
 * master without node_token, streams it to nobody. */
static int may_follow(const kvp_master *m, const kvp_mclient *c)
{
    return m->cfg.etcd[0] && m->cfg.node_token[0] && c->node;
}

/* A follower's share of repl_buffer_budget: what its connection's
 * unsent output may hold (snapshot and changes); past it the service cuts
 * it off. With at most max_followers, all of them hold at most the budget. */
static size_t fol_share(const kvp_master *m)
{
    uint64_t n = m->cfg.max_followers ? m->cfg.max_followers : 1;
    uint64_t share = m->cfg.repl_buffer_budget / n;
    return share < (8u << 20) ? (size_t)(8u << 20) : (size_t)share;
}

/* The follower's snapshot is complete: it is waited for once it has
 * acknowledged what was journaled up to now. */
static void fol_synced(kvp_master *m, struct follower *f)
{
    KVP_INFO(MOD, "standby %s: snapshot of %llu objects sent, at seq %llu", f->s->peer_addr,
             (unsigned long long)kvp_master_snap_count(f->snap), (unsigned long long)m->jseq);
    kvp_master_snap_free(m, f->snap);
    f->snap = NULL;
    f->mark_seq = m->jseq;
}

/*
 * REPL_FOLLOW (a standby of the cluster, see may_follow; else
 * KVP_EILLEGAL_CLIENT; beyond max_followers KVP_ELIMIT): answered, then
 * the snapshot -- RESET, every readable object, SYNCED -- as REPL_DATA
 * frames in the same output: its first budget at once (a small index
 * whole), the rest by kvp_master_push_snaps over the next turns, as fast
 * as the standby reads; the changes follow (kvp_master_push_repl). The
 * connection's output is bounded by the follower's share of
 * repl_buffer_budget. The follower is waited for once it acknowledged
 * the snapshot's end.
 */
static void op_repl_follow(req *q)
{
    kvp_master *m = q->m;
    if (q->h->body_len != 0) {
        reply_status(q, KVP_EPROTOCOL);
        return;
    }
    if (!may_follow(m, q->s->client)) {
        KVP_WARN_LIMITED(MOD, "REPL_FOLLOW refused to client %s: %s", q->s->client->name,
                         !m->cfg.etcd[0] ? "this master is in no cluster (no key \"etcd\")"
                         : !m->cfg.node_token[0]
                             ? "no node_token: no standby may follow the index"
                             : "the client lacks the node credential");
        reply_status(q, KVP_EILLEGAL_CLIENT);
        return;
    }
    struct follower *f = fol_of(m, q->s);
    if (!f && m->nfol >= (m->cfg.max_followers ? m->cfg.max_followers : 8)) {
        KVP_WARN_LIMITED(MOD, "REPL_FOLLOW refused to %s (client %s): %u standbys follow "
                              "already (max_followers)",
                         q->s->peer_addr, q->s->client->name, m->nfol);
        reply_status(q, KVP_ELIMIT);
        return;
    }
    if (!f) {
        if (m->nfol == m->fol_cap) {
            uint32_t cap = m->fol_cap ? m->fol_cap * 2 : 4;
            struct follower *nf = kvp_realloc(m->fol, cap * sizeof *nf);
            if (!nf) {
                reply_status(q, KVP_ENOMEM);
                return;
            }
            m->fol = nf;
            m->fol_cap = cap;
        }
        f = &m->fol[m->nfol++];
    } else {
        if (f->in_sync)
            m->fol_in_sync--;
        kvp_master_snap_free(m, f->snap); /* following again: a new snapshot */
    }
    *f = (struct follower){q->s, 0, UINT64_MAX, 0, NULL};
    reply_status(q, 0);
    kvp_buf *out = q->out;
    size_t share = fol_share(m);
    out->cap = share > out->len ? share : out->len;
    size_t mark = out->len;
    kvp_msnap *sn = kvp_master_snap_start(m, out);
    if (!sn) { /* out of memory: the connection is closed (out->err); the standby retries */
        out->err = KVP_ENOMEM;
        fol_remove(m, q->s);
        return;
    }
    f->snap = sn;
    q->s->follower = 1;
    int done = kvp_master_snap_step(m, sn, out, KVP_MASTER_SNAP_BUDGET);
    m->stats[KVP_STAT_REPL_BYTES] += out->len - mark;
    KVP_INFO(MOD, "standby %s follows the index at seq %llu (%u standbys)", q->s->peer_addr,
             (unsigned long long)m->jseq, m->nfol);
    if (done)
        fol_synced(m, f);
}

int kvp_master_push_snaps(kvp_master *m, kvp_buf *(*out)(kvp_msess *s, void *ctx), void *ctx)
{
    uint32_t pending = 0;
    for (uint32_t i = 0; i < m->nfol; i++)
        pending += m->fol[i].snap != NULL;
    if (!pending)
        return 0;
    /* one budget a turn, shared (a step writes at least one record, so
     * each progresses; past 128 followers the floor adds 2048 units each) */
    uint64_t budget = KVP_MASTER_SNAP_BUDGET / pending;
    if (budget < 2048)
        budget = 2048;
    int more = 0;
    for (uint32_t i = 0; i < m->nfol; i++) {
        struct follower *f = &m->fol[i];
        if (!f->snap)
            continue;
        kvp_buf *b = out(f->s, ctx); /* NULL: its window is full (or it is going) */
        if (!b)
            continue;
        size_t mark = b->len;
        int done = kvp_master_snap_step(m, f->snap, b, budget);
        m->stats[KVP_STAT_REPL_BYTES] += b->len - mark;
        if (done)
            fol_synced(m, f);
        else
            more = 1;
    }
    return more;
}

/* REPL_ACK (ONEWAY, from a follower): u64 seq applied. */
static void op_repl_ack(req *q)
{
    kvp_rd rd;
    kvp_rd_init(&rd, q->body, q->h->body_len);
    uint64_t seq = kvp_rd_u64(&rd);
    struct follower *f = fol_of(q->m, q->s);
    if (kvp_rd_finish(&rd) != 0 || !f || seq > q->m->jseq) {
        if (!(q->h->flags & KVP_FLAG_ONEWAY))
            reply_status(q, KVP_EPROTOCOL);
        return;
    }
    if (seq > f->acked)
        f->acked = seq;
}

void kvp_master_push_repl(kvp_master *m,
                          void (*send)(kvp_msess *s, const void *p, size_t n, void *ctx), void *ctx)
{
    kvp_repl_wr_close(&m->jw);
    if (m->jr.err) { /* out of memory: the followers cannot be told; they resync */
        KVP_WARN(MOD, "index stream lost (%s): standbys must follow again",
                 kvp_strerror(m->jr.err));
        kvp_buf_reset(&m->jr);
        return;
    }
    if (!m->jr.len)
        return;
    if (m->cfg.snapshot_file[0])
        send(NULL, m->jr.data, m->jr.len, ctx); /* the local file */
    for (uint32_t i = 0; i < m->nfol; i++) {
        send(m->fol[i].s, m->jr.data, m->jr.len, ctx);
        m->stats[KVP_STAT_REPL_BYTES] += m->jr.len;
    }
    kvp_buf_reset(&m->jr);
    kvp_buf_shrink(&m->jr, 1u << 20);
}

uint64_t kvp_master_repl_gate(const kvp_master *m)
{
    if (!m->cfg.etcd[0] || !m->cfg.ha_sync) /* ha_sync: a cluster's only */
        return 0;
    return m->fol_in_sync ? m->jseq : 0;
}

void kvp_master_repl_state(kvp_master *m, uint64_t now, kvp_repl_state *st)
{
    uint64_t acked = m->jseq, lag = 0, limit = m->cfg.ha_sync_timeout_ms;
    for (uint32_t i = 0; i < m->nfol; i++) {
        struct follower *f = &m->fol[i];
        /* judged by the oldest record it lacks, however it paces its acks */
        uint64_t age = unacked_age(m, f->acked, now);
        if (!f->in_sync && f->acked >= f->mark_seq && age <= limit / 2) {
            /* caught up, and keeps up well within the limit (a follower
             * that keeps just under it stays out: no flapping) */
            f->in_sync = 1;
            m->fol_in_sync++;
            KVP_INFO(MOD, "standby %s in sync at seq %llu", f->s->peer_addr,
                     (unsigned long long)f->acked);
        } else if (f->in_sync && age > limit) {
            f->in_sync = 0;
            m->fol_in_sync--;
            f->mark_seq = m->jseq; /* in sync again once it has all of today */
            KVP_WARN(MOD, "standby %s left seq %llu unacknowledged for over %llu ms: no longer "
                          "waited for until it catches up",
                     f->s->peer_addr, (unsigned long long)f->acked + 1,
                     (unsigned long long)limit);
        }
        if (f->in_sync && f->acked < acked)
            acked = f->acked;
        if (m->jseq - f->acked > lag)
            lag = m->jseq - f->acked;
    }
    m->stats[KVP_STAT_REPL_FOLLOWERS] = m->nfol;
    m->stats[KVP_STAT_REPL_IN_SYNC] = m->fol_in_sync;
    m->stats[KVP_STAT_REPL_SEQ] = m->jseq;
    st->seq = m->jseq;
    st->acked = acked;
    st->followers = m->nfol;
    st->in_sync = m->fol_in_sync;
    m->stats[KVP_STAT_REPL_LAG] = lag;
}

/* ---------------------------------------------------------- standby side */

static void parked_free(kvp_master *m, kvp_obj *o)
{
    kvp_index_remove(&m->parked, o);
    KVP_ASSERT(m->tenant_nobj[o->tenant] > 0);
    m->tenant_nobj[o->tenant]--;
    tenant_release_if_empty(m, o->tenant);
    kvp_sfree(o, kvp_obj_size(o));
}

/* A parked object is gone for good: the standbys and the snapshot file
 * forget it too. */
static void parked_drop(kvp_master *m, kvp_obj *o)
{
    journal_del(m, o);
    parked_free(m, o);
}

/* Drops every parked object (journaled when `forget`); returns how many. */
static uint64_t parked_clear(kvp_master *m, int forget)
{
    uint64_t n = 0;
    if (!m->parked.slots)
        return 0;
    kvp_index_settle(&m->parked);
    for (uint64_t i = 0; m->parked.count && i <= m->parked.mask; i++) {
        kvp_obj *o = kvp_index_at(&m->parked, i);
        if (o) {
            if (forget)
                parked_drop(m, o);
            else
                parked_free(m, o);
            n++;
            i--; /* backward shift may have moved an unvisited entry here */
        }
    }
    m->npseg = 0;
    return n;
}

static int pseg_index(kvp_master *m, uint64_t id)
{
    for (uint32_t i = 0; i < m->npseg; i++)
        if (m->pseg[i] == id)
            return (int)i;
    if (m->npseg == PSEG_MAX)
        return KVP_ELIMIT;
    if (m->npseg == m->pseg_cap) {
        uint32_t cap = m->pseg_cap ? m->pseg_cap * 2 : 16;
        uint64_t *p = kvp_realloc(m->pseg, cap * sizeof *p);
        if (!p)
            return KVP_ENOMEM;
        m->pseg = p;
        m->pseg_cap = cap;
    }
    m->pseg[m->npseg] = id;
    return (int)m->npseg++;
}

static int park(kvp_master *m, const kvp_repl_rec *r)
{
    if (!m->parked.slots && kvp_index_init(&m->parked, 0) != 0)
        return KVP_ENOMEM;
    int t = tenant_find(m, r->tenant);
    uint64_t h = 0;
    kvp_obj *old = NULL;
    if (t >= 0) {
        h = kvp_index_hash((uint16_t)t, r->key.p, r->key.len);
        old = kvp_index_find(&m->parked, h, (uint16_t)t, r->key.p, r->key.len);
    }
    if (r->type == KVP_REPL_DEL) {
        if (old)
            parked_free(m, old);
        return 0;
    }
    if (old)
        parked_free(m, old); /* (its tenant stays: the new record needs it) */
    if (r->key.len > m->cfg.max_key || r->size > m->cfg.max_object_size)
        return KVP_ELIMIT; /* the leader is configured beyond this master */
    kvp_orep reps[KVP_MAX_REPLICAS];
    for (unsigned i = 0; i < r->nrep; i++) {
        int k = pseg_index(m, r->rep[i].seg_id);
        if (k < 0)
            return k;
        reps[i] = (kvp_orep){(uint32_t)k, r->rep[i].page, r->rep[i].gen};
    }
    t = tenant_get(m, r->tenant);
    if (t < 0)
        return t;
    h = kvp_index_hash((uint16_t)t, r->key.p, r->key.len);
    /* its block: the tenant's group learns the leader's parts and size */
    kvp_blkinfo bi = {r->blk_hash, 0, r->block_size, r->parts, r->group, 0};
    int blk = (r->flags & KVP_REPL_F_BLOCK) && kvp_kvblk_admit(m->kb, (uint16_t)t, &bi) == 1;
    kvp_obj *o = NULL;
    if (kvp_index_reserve(&m->parked) == 0)
        o = kvp_salloc(kvp_obj_bytes((uint16_t)r->key.len, r->nrep, blk));
    if (!o) {
        tenant_release_if_empty(m, t);
        return KVP_ENOMEM;
    }
    memset(o, 0, sizeof *o);
    o->size = r->size;
    o->checksum = r->checksum;
    o->tenant = (uint16_t)t;
    o->keylen = (uint16_t)r->key.len;
    o->state = KVP_OBJ_COMPLETE;
    o->nrep = o->rep_cap = r->nrep;
    o->flags = (r->flags & KVP_REPL_F_PINNED) ? KVP_OBJ_PINNED : 0;
    if (blk) { /* parked: kept in the record, indexed by block once adopted */
        o->blk = 1;
        o->group = r->group;
        memcpy(o + 1, &r->blk_hash, sizeof r->blk_hash);
    }
    memcpy((uint8_t *)kvp_obj_key(o), r->key.p, r->key.len);
    memcpy(kvp_obj_reps(o), reps, r->nrep * sizeof *reps);
    kvp_index_insert(&m->parked, h, o);
    m->tenant_nobj[t]++;
    return 0;
}

int kvp_master_repl_apply(kvp_master *m, const uint8_t *body, size_t len, uint64_t *seq)
{
    if (kvp_repl_check(body, len) != 0)
        return KVP_EPROTOCOL;
    kvp_repl_rd it;
    kvp_repl_rec r;
    int rc = kvp_repl_open(&it, body, len, seq);
    while (rc == 0 && kvp_repl_next(&it, &r) == 1) {
        if (r.type == KVP_REPL_RESET)
            parked_clear(m, 0);
        else if (r.type == KVP_REPL_PUB || r.type == KVP_REPL_DEL)
            rc = park(m, &r);
    }
    m->stats[KVP_STAT_PARKED] = m->parked.count;
    return rc;
}

void kvp_master_takeover(kvp_master *m, uint64_t now)
{
    m->now = now;
    m->parked_until = now + m->cfg.client_ttl_ms;
    m->stats[KVP_STAT_PARKED] = m->parked.count;
    KVP_INFO(MOD, "leader now: %llu objects of the leader before wait for %u segments to mount "
                  "(%llu ms)",
             (unsigned long long)m->parked.count, m->npseg,
             (unsigned long long)m->cfg.client_ttl_ms);
}

typedef struct claim {
    kvp_obj *o;
    uint32_t page, gen;
} claim;

static int claim_cmp(const void *a, const void *b)
{
    uint32_t x = ((const claim *)a)->page, y = ((const claim *)b)->page;
    return x < y ? -1 : x > y;
}

/* One parked object becomes live with its replica c on segment si (space
 * claimed). 0, or a negative code (o stays parked). */
static int adopt_one(kvp_master *m, uint32_t si, const claim *c)
{
    kvp_obj *p = c->o;
    kvp_mseg *s = m->segs[si];
    uint32_t np = kvp_pages(p->size);
    uint64_t h = kvp_index_hash(p->tenant, kvp_obj_key(p), p->keylen);
    if (kvp_index_find(&m->ix, h, p->tenant, kvp_obj_key(p), p->keylen) ||
        kvp_index_find(&m->repl, h, p->tenant, kvp_obj_key(p), p->keylen))
        return KVP_EOBJECT_ALREADY_EXISTS; /* put again since the takeover */
    if ((uint64_t)c->page + np > s->capacity >> 12 || kvp_index_reserve(&m->ix) != 0)
        return KVP_EINVALID_PARAMS;
    int rc = kvp_segalloc_claim(s->alloc, c->page, np);
    if (rc)
        return rc;
    kvp_obj *o = NULL;
    if (!p->blk || kvp_kvblk_reserve(m->kb) == 0)
        o = kvp_salloc(kvp_obj_bytes(p->keylen, 1, p->blk));
    if (!o) {
        kvp_segalloc_free(s->alloc, c->page, np);
        return KVP_ENOMEM;
    }
    memcpy(o, p, kvp_obj_rep_off(p->keylen, p->blk));
    o->ev_dram = o->ev_disk = 0;
    o->prev = o->next = NULL;
    o->nrep = o->rep_cap = 1;
    o->list = KVP_LIST_NONE;
    o->lease_seq = ++m->lease_seq;
    *kvp_obj_reps(o) = (kvp_orep){si, c->page, c->gen};
    if (c->gen > s->gen)
        s->gen = c->gen; /* later allocations' generations stay above it */
    s->used_pages += np;
    s->nrep++;
    m->used_pages += np;
    m->tenant_nobj[p->tenant]++; /* the parked one's count goes below */
    parked_free(m, p);
    kvp_index_insert(&m->ix, h, o);
    if (o->blk)
        kvp_kvblk_insert(m->kb, o); /* announced by journal_pub below */
    tenant_pages(m, o, 1);
    m->tq[o->tenant].bytes += o->size;
    m->stats[KVP_STAT_OBJECTS]++;
    m->stats[KVP_STAT_BYTES] += o->size;
    cfg_count(m, o, 1);
    m->stats[KVP_STAT_ADOPTED]++;
    o->exposed = m->stamp;
    settle_unleased(m, o);
    journal_pub(m, o);
    return 0;
}

/* A segment just mounted (slot si, nothing allocated on it yet): the
 * parked objects with a replica there take it back, in page order (the
 * allocator's claims are O(1) so). An object on several segments comes
 * back with the first of them that mounts; its other copies' space is
 * simply free here. */
static void adopt_parked(kvp_master *m, uint32_t si)
{
    kvp_mseg *s = m->segs[si];
    int k = -1;
    for (uint32_t i = 0; i < m->npseg; i++)
        if (m->pseg[i] == s->id)
            k = (int)i;
    if (k < 0 || !m->parked.count)
        return;
    claim *cl = kvp_malloc((size_t)m->parked.count * sizeof *cl);
    if (!cl) {
        KVP_WARN(MOD, "out of memory: the objects of segment %016llx stay parked",
                 (unsigned long long)s->id);
        return;
    }
    size_t n = 0;
    kvp_index_settle(&m->parked);
    for (uint64_t i = 0; i <= m->parked.mask; i++) {
        kvp_obj *o = kvp_index_at(&m->parked, i);
        if (!o)
            continue;
        const kvp_orep *r = kvp_obj_reps(o);
        for (unsigned j = 0; j < o->nrep; j++)
            if (r[j].seg == (uint32_t)k) {
                cl[n++] = (claim){o, r[j].page, r[j].gen};
                break;
            }
    }
    qsort(cl, n, sizeof *cl, claim_cmp);
    uint64_t got = 0, lost = 0;
    for (size_t i = 0; i < n; i++) {
        int rc = adopt_one(m, si, &cl[i]);
        if (rc == 0) {
            got++;
        } else if (rc == KVP_EOBJECT_ALREADY_EXISTS) { /* put again: the new one stays */
            lost++;
            parked_free(m, cl[i].o);
        } else { /* overlapping, or out of range: not this object */
            lost++;
            parked_drop(m, cl[i].o);
        }
    }
    kvp_free(cl);
    m->stats[KVP_STAT_ADOPT_DROPPED] += lost;
    m->stats[KVP_STAT_PARKED] = m->parked.count;
    KVP_INFO(MOD, "segment %016llx (%s) came back: %llu objects taken over, %llu dropped, "
                  "%llu still parked",
             (unsigned long long)s->id, s->name, (unsigned long long)got,
             (unsigned long long)lost, (unsigned long long)m->parked.count);
}

/* client_ttl after a takeover: what no segment claimed is gone. */
static void parked_expire(kvp_master *m, uint64_t now)
{
    if (!m->parked_until || now < m->parked_until)
        return;
    m->parked_until = 0;
    uint64_t n = parked_clear(m, 1);
    m->stats[KVP_STAT_ADOPT_DROPPED] += n;
    m->stats[KVP_STAT_PARKED] = 0;
    if (n)
        KVP_WARN(MOD, "%llu objects of the leader before dropped: their segments did not mount "
                      "within client_ttl",
                 (unsigned long long)n);
}

int kvp_master_handle(kvp_master *m, kvp_msess *s, const kvp_frame_hdr *h, const uint8_t *body,
                      kvp_arena *a, kvp_buf *out, uint64_t now_ms)
{
    req q = {m, s, h, body, a, out, now_ms};
    m->now = now_ms;
    size_t mark = out->len;
    m->stats[KVP_STAT_REQUESTS]++;
    if (h->flags & KVP_FLAG_RESPONSE) {
        m->stats[KVP_STAT_BAD_FRAMES]++;
        reply_status(&q, KVP_EPROTOCOL);
    } else if (h->op == KVP_OP_HELLO) {
        op_hello(&q);
    } else if (h->op == KVP_OP_AUTH_CHALLENGE) {
        op_challenge(&q);
    } else if (!kvp_op_name(h->op)) {
        reply_status(&q, KVP_EUNKNOWN_OP);
    } else if (!s->client) {
        reply_status(&q, KVP_ENO_HELLO);
    } else {
        s->client->last_seen = now_ms;
        switch (h->op) {
        case KVP_OP_MOUNT_SEGMENT: op_mount(&q); break;
        case KVP_OP_UNMOUNT_SEGMENT: op_unmount(&q); break;
        case KVP_OP_HEARTBEAT: op_heartbeat(&q); break;
        case KVP_OP_PUT_START: op_put_start(&q); break;
        case KVP_OP_PUT_END: op_put_end(&q); break;
        case KVP_OP_PUT_REVOKE: op_put_revoke(&q); break;
        case KVP_OP_GET: op_get(&q); break;
        case KVP_OP_RELEASE: op_release(&q); break;
        case KVP_OP_EXIST: op_exist(&q, 0); break;
        case KVP_OP_PREFIX: op_exist(&q, 1); break;
        case KVP_OP_REMOVE: op_remove(&q); break;
        case KVP_OP_REMOVE_ALL: op_remove_all(&q); break;
        case KVP_OP_REMOVE_REGEX: op_remove_regex(&q); break;
        case KVP_OP_STATS: op_stats(&q); break;
        case KVP_OP_CONFIGS: op_configs(&q); break;
        case KVP_OP_SEGMENT_INFO: op_seg_info(&q); break;
        case KVP_OP_REPLICA_BAD: op_replica_bad(&q); break;
        case KVP_OP_SEG_FAILING: op_seg_failing(&q); break;
        case KVP_OP_DISK_REPORT: op_disk_report(&q); break;
        case KVP_OP_TIERS: op_exist(&q, 2); break;
        case KVP_OP_SEG_FREED_ACK: op_seg_freed_ack(&q); break;
        case KVP_OP_REPL_FOLLOW: op_repl_follow(&q); break;
        case KVP_OP_REPL_ACK: op_repl_ack(&q); break;
        case KVP_OP_LOOKUP_HASHES: op_lookup_hashes(&q); break;
        case KVP_OP_KV_SNAPSHOT: op_kv_snapshot(&q); break;
        case KVP_OP_EXIST_LEASE: op_exist_lease(&q); break;
        default: reply_status(&q, KVP_EUNKNOWN_OP); break;
        }
    }
    if (out->err) {
        /* the response did not fit: answer with the error alone */
        int err = out->err;
        out->err = 0;
        out->len = mark;
        reply_status(&q, err);
        if (out->err)
            return out->err;
    }
    return 0;
}

/* ============================================================= timers */

uint32_t kvp_master_tick(kvp_master *m, uint64_t now)
{
    unsigned work = 0;
    m->now = now;
    parked_expire(m, now);
    while (work < TICK_BUDGET && m->diskio.head && due(m->diskio.head->deadline, now)) {
        disk_timeout(m, m->diskio.head);
        work++;
    }
    while (work < TICK_BUDGET && m->leased.head && due(m->leased.head->deadline, now)) {
        lease_expire_all(m, m->leased.head);
        work++;
    }
    while (work < TICK_BUDGET && m->pending.head && due(m->pending.head->deadline, now)) {
        kvp_obj *o = m->pending.head;
        KVP_WARN(MOD, "put of a %llu-byte object timed out after %llu ms: revoked",
                 (unsigned long long)o->size, (unsigned long long)m->cfg.put_timeout_ms);
        obj_destroy(m, o, GONE_TIMEOUT);
        work++;
    }
    if (now - m->last_client_scan >= 100 || now < m->last_client_scan) {
        m->last_client_scan = now;
        for (uint32_t i = 0; i < m->client_cap; i++) {
            kvp_mclient *c = m->clients[i];
            if (c && !c->dropped && now - c->last_seen > m->cfg.client_ttl_ms &&
                now > c->last_seen)
                client_drop(m, c);
        }
    }
    if (m->ix.old)
        work += (unsigned)(kvp_index_step(&m->ix, 4 * TICK_BUDGET) / 4);
    if (m->repl.old)
        kvp_index_step(&m->repl, TICK_BUDGET);
    pin_sweep(m, TICK_BUDGET / 2); /* before eviction: pins that ended are victims */
    unsigned budget = work < TICK_BUDGET ? TICK_BUDGET - work : 0;
    unsigned ev = evict_background(m, budget);
    work += ev;
    if (work >= TICK_BUDGET)
        return 0;
    uint32_t next = TICK_IDLE_MS;
    if (m->leased.head) {
        int32_t d = (int32_t)(m->leased.head->deadline - ms32(now));
        if (d >= 0 && (uint32_t)d < next)
            next = (uint32_t)d;
    }
    if (m->pending.head) {
        int32_t d = (int32_t)(m->pending.head->deadline - ms32(now));
        if (d >= 0 && (uint32_t)d < next)
            next = (uint32_t)d;
    }
    return next;
}

void kvp_master_stalled(kvp_master *m, uint64_t ms, uint64_t now_ms)
{
    KVP_WARN(MOD, "the master could not serve for %llu ms: client silence and put deadlines "
                  "moved on by that much",
             (unsigned long long)ms);
    for (uint32_t i = 0; i < m->client_cap; i++) {
        kvp_mclient *c = m->clients[i];
        if (c && !c->dropped)
            c->last_seen = c->last_seen + ms < now_ms ? c->last_seen + ms : now_ms;
    }
    /* the same shift for every pending put keeps the list in deadline order */
    for (kvp_obj *o = m->pending.head; o; o = o->next)
        o->deadline += (uint32_t)ms;
    /* records journaled before the stall age from its end, as client
     * silence does: meanwhile they could not be pushed nor their acks read
     * (one monotone shift for all keeps the ring in order) */
    for (uint32_t i = 0; i < m->jt_n; i++) {
        struct jtime *e = &m->jt[(m->jt_head + i) % JT_SLOTS];
        e->ms = e->ms + ms < now_ms ? e->ms + ms : now_ms;
    }
}

/* ======================================================= life, stats */

/*
 * With tenant credentials: the master needs the node credential (else any
 * client could mount a segment and receive tenants' bytes, or report disk
 * records into their namespaces), and every listed tenant gets its slot,
 * quotas and share now. 0 or KVP_ECONFIG / KVP_ENOMEM (logged).
 */
static int tenants_configure(kvp_master *m)
{
    /* kvpool serve: this process's own node would offer ucx */
    if ((!strcmp(m->cfg.protocol, "ucx") || !strcmp(m->cfg.protocol, "rdma")) &&
        !m->cfg.ucx_insecure) {
        KVP_ERROR(MOD, "key \"protocol\" %s with key \"tenant_tokens_file\": a UCX remote key "
                       "reads and writes every tenant's bytes in the segment, so any holder of "
                       "the cluster token would reach every tenant; use protocol tcp, or set "
                       "key \"ucx_insecure\" to accept that",
                  m->cfg.protocol);
        return KVP_ECONFIG;
    }
    if (!m->cfg.node_token[0]) {
        KVP_ERROR(MOD, "key \"tenant_tokens_file\" needs key \"node_token\": with tenants, only "
                       "holders of the node credential may mount segments; set node_token "
                       "(node_token_file or $KVPOOL_NODE_TOKEN) on the master and every "
                       "storage node");
        return KVP_ECONFIG;
    }
    if (m->ntcreds + 1 > m->cfg.max_tenants) {
        KVP_ERROR(MOD, "key \"tenant_tokens_file\": %zu tenants, more than max_tenants (%llu) "
                       "leaves room for",
                  m->ntcreds, (unsigned long long)m->cfg.max_tenants - 1);
        return KVP_ECONFIG;
    }
    for (size_t i = 0; i < m->ntcreds; i++) {
        const kvp_tenant_cred *c = &m->tcreds[i];
        int id = tenant_get(m, (kvp_bytes){(const uint8_t *)c->tenant, (uint32_t)strlen(c->tenant)});
        if (id < 0) {
            KVP_ERROR(MOD, "key \"tenant_tokens_file\": tenant \"%s\": %s", c->tenant,
                      kvp_strerror(id));
            return id == KVP_ENOMEM ? KVP_ENOMEM : KVP_ECONFIG;
        }
        kvp_auth_kid(c->token, strlen(c->token), m->tcreds[i].kid);
        mtenant *t = &m->tq[id];
        t->configured = 1;
        t->max_pages = c->max_bytes ? (c->max_bytes + 4095) >> 12 : 0;
        t->max_objects = c->max_objects;
        t->share = c->share ? c->share : 1;
    }
    return 0;
}

int kvp_master_create(const kvp_config *cfg, uint64_t now_ms, kvp_master **out)
{
    kvp_master *m = kvp_calloc(1, sizeof *m);
    if (!m)
        return KVP_ENOMEM;
    m->cfg = *cfg;
    kvp_proto_limits_default(&m->lim);
    m->lim.max_key = (uint32_t)cfg->max_key;
    m->client_cap = (uint32_t)cfg->max_connections;
    if (getrandom(&m->id, sizeof m->id, 0) != sizeof m->id)
        m->id = now_ms ^ 0x9E3779B97F4A7C15ull;
    m->rng = m->id | 1;
    m->last_client_scan = now_ms;
    m->segs = kvp_calloc(cfg->max_segments, sizeof *m->segs);
    m->mounted = kvp_calloc(cfg->max_segments, sizeof *m->mounted);
    m->dirty = kvp_calloc(cfg->max_segments, sizeof *m->dirty);
    m->clients = kvp_calloc(m->client_cap, sizeof *m->clients);
    m->tenants = kvp_calloc(cfg->max_tenants, sizeof *m->tenants);
    m->tenant_len = kvp_calloc(cfg->max_tenants, sizeof *m->tenant_len);
    m->tenant_nobj = kvp_calloc(cfg->max_tenants, sizeof *m->tenant_nobj);
    m->tq = kvp_calloc(cfg->max_tenants, sizeof *m->tq);
    m->evt = kvp_calloc(cfg->max_tenants, sizeof *m->evt);
    if (!m->segs || !m->mounted || !m->dirty || !m->clients || !m->tenants || !m->tenant_len ||
        !m->tenant_nobj || !m->tq || !m->evt ||
        kvp_index_init(&m->ix, 0) != 0 || kvp_index_init(&m->repl, 0) != 0 ||
        kvp_kvblk_create((uint32_t)cfg->max_tenants, cfg->kv_events[0] != 0, obj_tiers,
                         tenant_name, m, &m->kb) != 0 ||
        kvp_cfgtab_init(&m->cfgs) != 0) {
        kvp_kvblk_destroy(m->kb);
        kvp_cfgtab_free(&m->cfgs);
        kvp_index_free(&m->ix);
        kvp_index_free(&m->repl);
        kvp_free(m->segs);
        kvp_free(m->mounted);
        kvp_free(m->dirty);
        kvp_free(m->clients);
        kvp_free(m->tenants);
        kvp_free(m->tenant_len);
        kvp_free(m->tenant_nobj);
        kvp_free(m->tq);
        kvp_free(m->evt);
        kvp_free(m);
        return KVP_ENOMEM;
    }
    for (uint32_t i = 0; i < cfg->max_tenants; i++)
        tenant_reset(&m->tq[i]);
    kvp_buf_init(&m->jr, SIZE_MAX / 2);
    m->jw.out = &m->jr;
    /* (JT_SLOTS - 1) steps span ha_sync_timeout at least */
    m->jt_step_ms = (cfg->ha_sync_timeout_ms + JT_SLOTS / 2 - 1) / (JT_SLOTS / 2);
    if (!m->jt_step_ms)
        m->jt_step_ms = 1;
    if (cfg->etcd[0] && !cfg->node_token[0])
        KVP_WARN(MOD, "a cluster's master without node_token: no standby may follow its index "
                      "(REPL_FOLLOW needs the node credential), so a takeover starts with an "
                      "empty index; set node_token (node_token_file or $KVPOOL_NODE_TOKEN) on "
                      "every master and storage node");
    m->tenants[0] = NULL; /* "default": matched by name below */
    m->ntenants = 1;
    m->ntenants_live = 1;
    static const char def[] = "default";
    m->tenant_len[0] = sizeof def - 1;
    m->tenants[0] = kvp_strdup(def);
    if (!m->tenants[0]) {
        kvp_master_destroy(m);
        return KVP_ENOMEM;
    }
    if (cfg->tenant_tokens_file[0]) {
        char err[KVP_CONFIG_ERRLEN];
        int rc = kvp_secret_tenants_load(cfg->tenant_tokens_file, &m->tcreds, &m->ntcreds, err,
                                         sizeof err);
        if (rc) {
            KVP_ERROR(MOD, "key \"tenant_tokens_file\": %s", err);
            kvp_master_destroy(m);
            return rc;
        }
        KVP_INFO(MOD, "%zu tenant credentials from %s", m->ntcreds, cfg->tenant_tokens_file);
        rc = tenants_configure(m);
        if (rc) {
            kvp_master_destroy(m);
            return rc;
        }
    }
    /* a start with an empty index: routers forget what they were told */
    for (uint32_t t = 0; t < m->ntenants; t++)
        if (m->tenants[t])
            kvp_kvblk_cleared(m->kb, (uint16_t)t);
    *out = m;
    return 0;
}

void kvp_master_destroy(kvp_master *m)
{
    if (!m)
        return;
    while (m->jobs) {
        rjob *j = m->jobs;
        m->jobs = j->next;
        job_free(m, j);
    }
    for (uint32_t i = 0; i < m->nfol; i++) { /* sessions not closed: their scans stop */
        kvp_master_snap_free(m, m->fol[i].snap);
        m->fol[i].snap = NULL;
    }
    kvp_index *ixs[3] = {&m->ix, &m->repl, &m->parked};
    for (int k = 0; k < 3; k++) {
        if (!ixs[k]->slots)
            continue;
        kvp_index_settle(ixs[k]);
        for (uint64_t i = 0; i <= ixs[k]->mask; i++) {
            kvp_obj *o = kvp_index_at(ixs[k], i);
            if (o)
                kvp_sfree(o, kvp_obj_size(o));
        }
        kvp_index_free(ixs[k]);
    }
    kvp_kvblk_destroy(m->kb);
    kvp_cfgtab_free(&m->cfgs);
    for (uint32_t i = 0; m->segs && i < m->cfg.max_segments; i++)
        if (m->segs[i])
            seg_free(m->segs[i]);
    for (uint32_t i = 0; m->clients && i < m->client_cap; i++)
        kvp_free(m->clients[i]);
    for (uint32_t i = 0; m->tenants && i < m->ntenants; i++)
        kvp_free(m->tenants[i]);
    kvp_buf_free(&m->jr);
    kvp_free(m->fol);
    kvp_free(m->pseg);
    kvp_free(m->segs);
    kvp_free(m->dirty);
    kvp_free(m->mounted);
    kvp_free(m->clients);
    kvp_free(m->tenants);
    kvp_free(m->tenant_len);
    kvp_free(m->tenant_nobj);
    kvp_free(m->tq);
    kvp_free(m->evt);
    kvp_free(m->quar);
    kvp_free(m->xq);
    if (m->tcreds)
        memset(m->tcreds, 0, m->ntcreds * sizeof *m->tcreds);
    kvp_free(m->tcreds);
    kvp_free(m);
}

uint64_t kvp_master_id(const kvp_master *m) { return m->id; }

void kvp_master_note_bad_frame(kvp_master *m) { m->stats[KVP_STAT_BAD_FRAMES]++; }

void kvp_master_sess_open(kvp_master *m, kvp_msess *s)
{
    (void)m;
    *s = (kvp_msess){.auth_tcred = -1}; /* every field: a caller's session may be on
                                          the stack (not challenged, no follower) */
    snprintf(s->peer_addr, sizeof s->peer_addr, "?");
}

void kvp_master_sess_close(kvp_master *m, kvp_msess *s, uint64_t now_ms)
{
    if (s->deferred)
        job_cancel(m, s);
    if (s->follower)
        fol_remove(m, s);
    kvp_mclient *c = s->client;
    s->client = NULL;
    if (!c)
        return;
    if (c->notify == s)
        c->notify = NULL;
    c->last_seen = now_ms;
    if (--c->nconns > 0)
        return;
    /* the writer is gone: its pending puts can never be completed */
    revoke_pending_of(m, c->slot);
    /* its segments may be gone with it (a process that exited without
     * unmounting): no placement there until it heartbeats again, rather than
     * puts failing on them until client_ttl drops it */
    for (uint32_t i = 0; !c->dropped && c->nseg && i < m->nseg; i++) {
        kvp_mseg *sg = m->segs[m->mounted[i]];
        if (sg->owner == c && !sg->suspect) {
            sg->suspect = 1;
            m->nsuspect++;
        }
    }
    if (c->dropped || c->nseg == 0) {
        if (!c->dropped)
            KVP_DEBUG(MOD, "client %016llx (%s) disconnected", (unsigned long long)c->id, c->name);
        client_free(m, c);
    }
}

void kvp_master_sess_alive(kvp_master *m, kvp_msess *s, uint64_t now_ms)
{
    (void)m;
    if (s->client && !s->client->dropped && now_ms > s->client->last_seen)
        s->client->last_seen = now_ms;
}

int kvp_master_sess_dead(const kvp_msess *s) { return s->client && s->client->dropped; }

/* Sends si's queued DISK_CMD entries, a frame per DQ_FRAME of them; 0,
 * or -1 when they could not all go now (what did not stays queued: a spill
 * or load waits for its command). */
static int push_disk(kvp_master *m, uint32_t si, kvp_buf *out)
{
    kvp_mseg *s = m->segs[si];
    if (!out)
        return -1;
    size_t from = 0;
    uint32_t sent = 0, cut = 0;
    int rc = 0;
    while (from < s->dq.len) {
        size_t end = cut < s->ndq_cuts ? s->dq_cuts[cut].end : s->dq.len;
        uint32_t n = cut < s->ndq_cuts ? s->dq_cuts[cut].n : s->dq_n - sent;
        size_t mark = out->len;
        size_t off = kvp_frame_begin(out, KVP_OP_DISK_CMD, KVP_FLAG_ONEWAY, 0, 0);
        kvp_buf_u64(out, s->id);
        kvp_buf_u32(out, n);
        kvp_buf_put(out, s->dq.data + from, end - from);
        kvp_frame_end(out, off);
        if (out->err) { /* the node's output is full: the rest next turn */
            out->err = 0;
            out->len = mark;
            rc = -1;
            break;
        }
        from = end;
        sent += n;
        cut++;
    }
    /* keep what was not sent, at the front */
    if (from && from < s->dq.len)
        memmove(s->dq.data, s->dq.data + from, s->dq.len - from);
    s->dq.len -= from;
    s->dq_n -= sent;
    uint32_t left = s->ndq_cuts > cut ? s->ndq_cuts - cut : 0;
    for (uint32_t i = 0; i < left; i++)
        s->dq_cuts[i] = (struct dq_cut){s->dq_cuts[cut + i].end - from, s->dq_cuts[cut + i].n};
    s->ndq_cuts = left;
    if (s->dq.len == 0)
        kvp_buf_shrink(&s->dq, 65536);
    return rc;
}

void kvp_master_push_freed(kvp_master *m, kvp_buf *(*out_for)(kvp_msess *s, void *ctx),
                           void *ctx)
{
    uint32_t n = m->ndirty, keep = 0;
    for (uint32_t d = 0; d < n; d++) {
        uint32_t si = m->dirty[d];
        kvp_mseg *s = m->segs[si];
        s->dirty = 0;
        kvp_msess *to = s->owner ? s->owner->notify : NULL;
        kvp_buf *out = to ? out_for(to, ctx) : NULL;
        int again = 0;
        /* unsent notices go in order; they stay queued until acknowledged
         * (op_seg_freed_ack), or dropped at a re-key (seg_mount). Without a
         * session they wait: a new one starts with a remount. */
        if (out && s->nsent < s->nntc) {
            size_t mark = out->len;
            kvp_freed fr[FREED_PER_FRAME];
            uint32_t at = s->nsent;
            while (at < s->nntc) {
                uint32_t k = s->nntc - at < FREED_PER_FRAME ? s->nntc - at : FREED_PER_FRAME;
                for (uint32_t j = 0; j < k; j++)
                    fr[j] = s->ntc[at + j].f;
                kvp_msg_seg_freed f = {s->id, s->seq_head + at + k - 1, k, fr};
                size_t off = kvp_frame_begin(out, KVP_OP_SEG_FREED, KVP_FLAG_ONEWAY, 0, 0);
                kvp_enc_seg_freed(out, &f);
                kvp_frame_end(out, off);
                if (out->err)
                    break;
                at += k;
                mark = out->len;
            }
            if (out->err) { /* the node's output is full: the rest next turn */
                out->err = 0;
                out->len = mark;
                again = 1;
            }
            s->nsent = at;
        }
        /* SSD tier commands are never dropped: a spill or a load waits for
         * its command, so those that cannot go now stay for the next turn */
        if (s->dq_n && push_disk(m, si, out) != 0)
            again = 1;
        if (again) {
            s->dirty = 1;
            m->dirty[keep++] = si; /* keep <= d: not yet visited slots are untouched */
        }
    }
    m->ndirty = keep;
}

static void view_name(char *out, size_t cap, const char *p, size_t len)
{
    if (len >= cap)
        len = cap - 1;
    memcpy(out, p, len);
    out[len] = '\0';
}

void kvp_master_view(const kvp_master *m, kvp_mview_seg *segs, uint32_t max_segs, uint32_t *nsegs,
                     kvp_mview_tenant *tenants, uint32_t max_tenants, uint32_t *ntenants)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < m->nseg && n < max_segs; i++) {
        const kvp_mseg *s = m->segs[m->mounted[i]];
        kvp_mview_seg *v = &segs[n++];
        view_name(v->name, sizeof v->name, s->name, s->namelen);
        v->id = s->id;
        v->capacity = s->capacity;
        v->used = s->used_pages << 12;
        v->replicas = s->nrep;
        v->largest_free = (uint64_t)kvp_segalloc_largest_free(s->alloc) << 12;
        v->disk_capacity = s->disk_cap;
        v->disk_used = s->disk_usage[0];
        v->disk_objects = s->disk_objs;
        v->disk_bytes = s->disk_bytes;
    }
    *nsegs = n;
    n = 0;
    for (uint32_t i = 0; i < m->ntenants && n < max_tenants; i++) {
        if (!m->tenants[i])
            continue;
        const mtenant *t = &m->tq[i];
        kvp_mview_tenant *v = &tenants[n++];
        view_name(v->name, sizeof v->name, m->tenants[i], m->tenant_len[i]);
        v->objects = m->tenant_nobj[i];
        v->bytes = t->bytes;
        v->pool_bytes = t->pages << 12;
        v->max_bytes = t->max_pages << 12;
        v->max_objects = t->max_objects;
        v->evictions = t->evictions;
        v->refused = t->refused;
        v->share = t->share;
    }
    *ntenants = n;
}

uint32_t kvp_master_view_configs(const kvp_master *m, kvp_mview_config *out, uint32_t max)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < KVP_CFGTAB_MAX && n < max; i++) {
        const kvp_cfgtab_row *r = kvp_cfgtab_slot(&m->cfgs, i);
        if (!r || !r->objects)
            continue;
        kvp_mview_config *v = &out[n++];
        snprintf(v->tenant, sizeof v->tenant, "%s", m->tenants[r->tenant] ? m->tenants[r->tenant] : "");
        snprintf(v->name, sizeof v->name, "%s", r->name);
        snprintf(v->fp, sizeof v->fp, "%s", r->fp);
        v->objects = r->objects;
        v->bytes = r->bytes;
    }
    for (uint32_t i = 0; i < m->ntenants && n < max; i++) {
        if (!m->tenants[i] || !m->tq[i].cfg_other[0])
            continue;
        kvp_mview_config *v = &out[n++];
        snprintf(v->tenant, sizeof v->tenant, "%s", m->tenants[i]);
        v->name[0] = v->fp[0] = '\0';
        v->objects = m->tq[i].cfg_other[0];
        v->bytes = m->tq[i].cfg_other[1];
    }
    return n;
}

uint32_t kvp_master_view_standbys(const kvp_master *m, kvp_mview_standby *out, uint32_t max)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < m->nfol && n < max; i++) {
        const struct follower *f = &m->fol[i];
        kvp_mview_standby *v = &out[n++];
        snprintf(v->peer, sizeof v->peer, "%s", f->s->peer_addr);
        snprintf(v->name, sizeof v->name, "%s", f->s->client ? f->s->client->name : "");
        v->acked = f->acked;
        v->lag = m->jseq - f->acked;
        v->in_sync = f->in_sync;
    }
    return n;
}

void kvp_master_stats(const kvp_master *m, uint64_t out[KVP_STAT__COUNT])
{
    memcpy(out, m->stats, sizeof m->stats);
    out[KVP_STAT_CAPACITY] = m->cap_pages << 12;
    out[KVP_STAT_USED] = m->used_pages << 12;
    out[KVP_STAT_CLIENTS] = m->nclients;
    out[KVP_STAT_SEGMENTS] = m->nseg;
    for (uint32_t i = 0; i < m->nseg; i++) {
        const uint64_t *u = m->segs[m->mounted[i]]->disk_usage;
        out[KVP_STAT_DISK_USED] += u[0];
        out[KVP_STAT_DISK_COMPACTED] += u[1];
        out[KVP_STAT_DISK_COMPACTED_PAGES] += u[2];
        out[KVP_STAT_DISK_DROPPED_PAGES] += u[3];
    }
    for (uint32_t t = 0; t < m->ntenants; t++)
        out[KVP_STAT_SOFT_PINNED] += m->tq[t].soft.n;
    kvp_kvblk_stats k;
    kvp_kvblk_stats_get(m->kb, &k);
    out[KVP_STAT_BLOCK_OBJECTS] = k.objects;
    out[KVP_STAT_BLOCK_CONFLICTS] = k.conflicts;
    out[KVP_STAT_KV_EVENTS] = k.events;
    out[KVP_STAT_KV_BATCHES] = k.batches;
    out[KVP_STAT_KV_LOST] = k.lost;
}

static int check_list(const olist *l, int which, uint64_t *seen)
{
    uint64_t n = 0;
    const kvp_obj *prev = NULL;
    for (const kvp_obj *o = l->head; o; o = o->next) {
        if (o->list != which || o->prev != prev)
            return -1;
        prev = o;
        n++;
    }
    *seen += n;
    return (l->tail == prev && n == l->n) ? 0 : -1;
}

/* Slot t of an index's current table, then of a draining one (checks). */
static uint64_t slots_total(const kvp_index *ix)
{
    return ix->mask + 1 + (ix->old ? ix->old_mask + 1 : 0);
}

static const kvp_obj *slot_obj(const kvp_index *ix, uint64_t t)
{
    uint64_t sv = t <= ix->mask ? ix->slots[t] : ix->old[t - ix->mask - 1];
    return (const kvp_obj *)(uintptr_t)(sv & 0xFFFFFFFFFFFFull);
}

int kvp_master_check(const kvp_master *m)
{
    uint64_t listed = 0, n = 0, none = 0, used = 0, leases = 0;
    if (kvp_kvblk_check(m->kb))
        return -1;
    if (check_list(&m->pending, KVP_LIST_PENDING, &listed) ||
        check_list(&m->leased, KVP_LIST_LEASED, &listed) ||
        check_list(&m->diskio, KVP_LIST_DISKIO, &listed) ||
        check_list(&m->disk, KVP_LIST_DISK, &listed))
        return -1;
    /* per tenant: its LRU list holds only its objects; evt lists exactly
     * the tenants with one; pages, bytes and share_sum add up (below) */
    uint32_t nevt = 0;
    uint64_t share_sum = 0;
    for (uint32_t t = 0; t < m->ntenants; t++) {
        const mtenant *tq = &m->tq[t];
        if (check_list(&tq->lru, KVP_LIST_LRU, &listed) ||
            check_list(&tq->soft, KVP_LIST_SOFT, &listed))
            return -1;
        for (const kvp_obj *o = tq->lru.head; o; o = o->next)
            if (o->tenant != t)
                return -14;
        for (const kvp_obj *o = tq->soft.head; o; o = o->next)
            if (o->tenant != t || !o->softpin)
                return -14;
        if (tq->sweep && tq->sweep->list != KVP_LIST_SOFT)
            return -14;
        if ((tq->lru.n > 0) != (tq->evpos >= 0) ||
            (tq->evpos >= 0 && ((uint32_t)tq->evpos >= m->nevt || m->evt[tq->evpos] != t)))
            return -15;
        nevt += tq->lru.n > 0;
        share_sum += tq->pages ? tq->share : 0;
        if (!m->tenants[t] && (tq->pages || tq->bytes || tq->lru.n || tq->soft.n))
            return -16;
    }
    if (nevt != m->nevt || share_sum != m->share_sum)
        return -15;
    uint64_t disk_objs = 0, spill = 0;
    uint64_t total = m->ix.mask + 1 + (m->ix.old ? m->ix.old_mask + 1 : 0);
    for (uint64_t t = 0; t < total; t++) { /* current table, then a draining one */
        uint64_t sv = t <= m->ix.mask ? m->ix.slots[t] : m->ix.old[t - m->ix.mask - 1];
        const kvp_obj *o = (const kvp_obj *)(uintptr_t)(sv & 0xFFFFFFFFFFFFull);
        if (!o)
            continue;
        uint64_t h = kvp_index_hash(o->tenant, kvp_obj_key(o), o->keylen);
        if (kvp_index_find(&m->ix, h, o->tenant, kvp_obj_key(o), o->keylen) != o ||
            (t > m->ix.mask && t - m->ix.mask - 1 < m->ix.mig))
            return -9; /* unreachable by lookup, or below the drain cursor */
        n++;
        int want = o->state == KVP_OBJ_PENDING ? KVP_LIST_PENDING
                   : o->aux > 0                ? KVP_LIST_LEASED
                                               : unleased_list(o);
        if (o->list != want)
            return -2;
        if (o->state == KVP_OBJ_COMPLETE) { /* holds are some of the leases */
            if (lease_holds(o) > lease_count(o))
                return -19;
            leases += lease_count(o);
        }
        none += want == KVP_LIST_NONE;
        if ((o->nrep == 0 && !(o->flags & KVP_OBJ_ONDISK)) || o->nrep > o->rep_cap)
            return -3;
        if (o->flags & (KVP_OBJ_ONDISK | KVP_OBJ_SPILLING | KVP_OBJ_LOADING)) {
            if (o->disk_seg >= m->cfg.max_segments || !m->segs[o->disk_seg] ||
                !m->segs[o->disk_seg]->disk_cap)
                return -11;
            disk_objs += (o->flags & KVP_OBJ_ONDISK) != 0;
            spill += (o->flags & KVP_OBJ_SPILLING) ? kvp_pages(o->size) : 0;
            if ((o->flags & KVP_OBJ_ONDISK) && (o->flags & KVP_OBJ_SPILLING))
                return -12;
        }
        const kvp_orep *r = kvp_obj_reps((kvp_obj *)o);
        for (unsigned k = 0; k < o->nrep; k++) {
            if (r[k].seg >= m->cfg.max_segments || !m->segs[r[k].seg])
                return -4;
            used += kvp_pages(o->size);
        }
        if (o->tenant >= m->ntenants || !m->tenants[o->tenant])
            return -16;
    }
    /* pending replacements: on the pending list, found in m->repl */
    uint64_t nrepl = 0;
    for (uint64_t t = 0; t < slots_total(&m->repl); t++) {
        const kvp_obj *o = slot_obj(&m->repl, t);
        if (!o)
            continue;
        uint64_t h = kvp_index_hash(o->tenant, kvp_obj_key(o), o->keylen);
        if (kvp_index_find(&m->repl, h, o->tenant, kvp_obj_key(o), o->keylen) != o ||
            !o->replacing || o->state != KVP_OBJ_PENDING || o->list != KVP_LIST_PENDING)
            return -18;
        used += (uint64_t)kvp_pages(o->size) * o->nrep;
        nrepl++;
    }
    if (nrepl != m->repl.count)
        return -18;
    n += nrepl;
    if (n != m->ix.count + m->repl.count || listed + none != n ||
        used + m->quar_pages + m->xq_pages != m->used_pages)
        return -5;
    if (disk_objs != m->stats[KVP_STAT_DISK_OBJECTS] || spill != m->spill_total)
        return -13;
    if (leases != m->stats[KVP_STAT_LEASES])
        return -19;
    uint64_t *tsum = kvp_calloc(2 * (size_t)m->ntenants, sizeof *tsum);
    if (tsum) { /* each tenant's pages and bytes are its objects' */
        for (uint64_t t = 0; t < total; t++) {
            uint64_t sv = t <= m->ix.mask ? m->ix.slots[t] : m->ix.old[t - m->ix.mask - 1];
            const kvp_obj *o = (const kvp_obj *)(uintptr_t)(sv & 0xFFFFFFFFFFFFull);
            if (o) {
                tsum[2 * o->tenant] += (uint64_t)kvp_pages(o->size) * o->nrep;
                tsum[2 * o->tenant + 1] += o->size;
            }
        }
        for (uint64_t t = 0; t < slots_total(&m->repl); t++) {
            const kvp_obj *o = slot_obj(&m->repl, t);
            if (o) {
                tsum[2 * o->tenant] += (uint64_t)kvp_pages(o->size) * o->nrep;
                tsum[2 * o->tenant + 1] += o->size;
            }
        }
        int bad = 0;
        for (uint32_t t = 0; t < m->ntenants; t++)
            bad |= tsum[2 * t] != m->tq[t].pages || tsum[2 * t + 1] != m->tq[t].bytes;
        kvp_free(tsum);
        if (bad)
            return -17;
    }
    /* per configuration: its row, else its tenant's other pair, counts
     * exactly its published objects (cfgtab.h) */
    if (kvp_cfgtab_check(&m->cfgs))
        return -19;
    uint64_t *cc = kvp_calloc(2 * (KVP_CFGTAB_MAX + (size_t)m->ntenants), sizeof *cc);
    if (cc) {
        for (uint64_t t = 0; t < total; t++) {
            const kvp_obj *o = slot_obj(&m->ix, t);
            kvp_cfgkey k;
            if (!o || o->state != KVP_OBJ_COMPLETE ||
                !kvp_cfgtab_parse(kvp_obj_key(o), o->keylen, &k))
                continue;
            const kvp_cfgtab_row *r = kvp_cfgtab_find(&m->cfgs, o->tenant, &k);
            size_t at = r ? (size_t)(r - m->cfgs.rows) : (size_t)KVP_CFGTAB_MAX + o->tenant;
            uint64_t *c = cc + 2 * at;
            c[0]++;
            c[1] += o->size;
        }
        int bad = 0;
        for (uint32_t i = 0; i < KVP_CFGTAB_MAX; i++) {
            const kvp_cfgtab_row *r = kvp_cfgtab_slot(&m->cfgs, i);
            bad |= r ? (r->objects != cc[2 * i] || r->bytes != cc[2 * i + 1])
                     : (cc[2 * i] != 0);
        }
        for (uint32_t t = 0; t < m->ntenants; t++)
            bad |= m->tq[t].cfg_other[0] != cc[2 * (KVP_CFGTAB_MAX + t)] ||
                   m->tq[t].cfg_other[1] != cc[2 * (KVP_CFGTAB_MAX + t) + 1];
        kvp_free(cc);
        if (bad)
            return -19;
    }
    uint64_t seg_used = 0;
    for (uint32_t i = 0; i < m->cfg.max_segments; i++) {
        if (!m->segs[i])
            continue;
        if (kvp_segalloc_check(m->segs[i]->alloc))
            return -6;
        uint64_t fp = kvp_segalloc_free_pages(m->segs[i]->alloc);
        if (fp + m->segs[i]->used_pages != (m->segs[i]->capacity >> 12))
            return -7;
        seg_used += m->segs[i]->used_pages;
    }
    uint64_t *lru = kvp_calloc(m->cfg.max_segments, sizeof *lru);
    if (lru) { /* skipped only when the check itself cannot allocate */
        for (uint32_t t = 0; t < m->ntenants; t++)
            for (int w = 0; w < 2; w++)
                for (const kvp_obj *o = w ? m->tq[t].soft.head : m->tq[t].lru.head; o;
                     o = o->next) {
                    const kvp_orep *r = kvp_obj_reps((kvp_obj *)o);
                    for (unsigned k = 0; k < o->nrep; k++)
                        lru[r[k].seg] += kvp_pages(o->size);
                }
        int bad = 0;
        for (uint32_t i = 0; i < m->cfg.max_segments; i++)
            bad |= m->segs[i] && m->segs[i]->lru_pages != lru[i];
        kvp_free(lru);
        if (bad)
            return -10;
    }
    return seg_used == m->used_pages ? 0 : -8;
}
