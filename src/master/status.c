/* status.c -- the master's published picture and what the HTTP endpoint
 * renders from it: metrics, /api/stats, health. */
#include "master/status.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/prom.h"
#include "kvpool.h"
#include "proto/proto.h"

#define PUBLISH_MS 1000
#define STUCK_MS 5000       /* no publish for this long: the loop is stuck */
#define MAX_SEGS 4096       /* segments shown (labels stay bounded) */
#define MAX_TENANTS 256     /* tenants shown */
#define HISTORY 600         /* samples kept: 10 minutes at one a second */
#define API_HISTORY 300     /* ... of which /api/stats returns the last 5 minutes */
#define MAX_STANDBYS 16     /* standbys listed */
#define MAX_CONFIGS 512     /* configuration rows shown (cfgtab's 256 + tenants' other) */

/* the error table's codes, for errors by code */
static const int err_codes[] = {
#define XX(name, num, msg) num,
    KVP_ERRNO_MAP(XX)
#undef XX
};
#define NERR (sizeof err_codes / sizeof err_codes[0])

typedef struct sample {
    uint64_t ms; /* CLOCK_REALTIME */
    uint64_t hits, misses, puts, put_bytes, hit_bytes, requests, evictions, pressure;
    uint64_t used, capacity, objects;
} sample;

/* What one publish copies; the HTTP thread copies it out under mu. */
typedef struct picture {
    uint64_t at_ms;                  /* kvp_now_ms of the publish; 0 = none yet */
    uint64_t st[KVP_STAT__COUNT];
    kvp_msvc svc;
    int role;
    uint32_t nsegs, ntenants;
    kvp_mview_seg *segs;             /* MAX_SEGS */
    kvp_mview_tenant *tenants;       /* MAX_TENANTS */
    kvp_mview_standby standbys[MAX_STANDBYS];
    uint32_t nstandbys;
    kvp_mview_config *configs;       /* MAX_CONFIGS */
    uint32_t nconfigs;
} picture;

struct kvp_mstatus {
    char listen[256];
    uint64_t start_ms;               /* CLOCK_REALTIME */
    _Atomic int role;
    uint64_t last_publish;           /* the owner's: kvp_now_ms of its last publish */
    kvp_prom_hist lat[KVP_OP__MAX];  /* per op, lock-free */
    _Atomic uint64_t errs[NERR];     /* answers per status code (index in err_codes) */
    _Atomic uint64_t errs_other;
    pthread_mutex_t mu;              /* guards pic and the history */
    picture pic;
    sample hist[HISTORY];
    uint64_t nhist;                  /* samples so far; the next goes to nhist % HISTORY */
};

static uint64_t real_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

kvp_mstatus *kvp_mstatus_new(const char *listen)
{
    kvp_mstatus *st = kvp_calloc(1, sizeof *st);
    if (!st)
        return NULL;
    st->pic.segs = kvp_calloc(MAX_SEGS, sizeof *st->pic.segs);
    st->pic.tenants = kvp_calloc(MAX_TENANTS, sizeof *st->pic.tenants);
    st->pic.configs = kvp_calloc(MAX_CONFIGS, sizeof *st->pic.configs);
    if (!st->pic.segs || !st->pic.tenants || !st->pic.configs) {
        kvp_mstatus_free(st);
        return NULL;
    }
    snprintf(st->listen, sizeof st->listen, "%s", listen ? listen : "");
    st->start_ms = real_ms();
    pthread_mutex_init(&st->mu, NULL);
    return st;
}

void kvp_mstatus_free(kvp_mstatus *st)
{
    if (!st)
        return;
    if (st->pic.segs && st->pic.tenants && st->pic.configs)
        pthread_mutex_destroy(&st->mu);
    kvp_free(st->pic.segs);
    kvp_free(st->pic.tenants);
    kvp_free(st->pic.configs);
    kvp_free(st);
}

void kvp_mstatus_role(kvp_mstatus *st, int role) { atomic_store(&st->role, role); }

void kvp_mstatus_op(kvp_mstatus *st, uint16_t op, uint64_t ns, int32_t status)
{
    if (op < KVP_OP__MAX)
        kvp_prom_hist_add(&st->lat[op], ns);
    if (status == 0)
        return;
    for (size_t i = 0; i < NERR; i++)
        if (err_codes[i] == status) {
            atomic_fetch_add_explicit(&st->errs[i], 1, memory_order_relaxed);
            return;
        }
    atomic_fetch_add_explicit(&st->errs_other, 1, memory_order_relaxed);
}

int kvp_mstatus_due(const kvp_mstatus *st, uint64_t now_ms)
{
    return st->last_publish == 0 || now_ms - st->last_publish >= PUBLISH_MS;
}

/* Names are untrusted bytes: printable ASCII only from here on, so that
 * neither a label nor a JSON string can be broken by one. */
static void clean(char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
            *s = '?';
}

void kvp_mstatus_publish(kvp_mstatus *st, const kvp_master *m, const kvp_msvc *svc,
                         uint64_t now_ms)
{
    st->last_publish = now_ms ? now_ms : 1;
    pthread_mutex_lock(&st->mu);
    picture *p = &st->pic;
    p->at_ms = st->last_publish;
    kvp_master_stats(m, p->st);
    p->svc = *svc;
    p->role = atomic_load(&st->role);
    kvp_master_view(m, p->segs, MAX_SEGS, &p->nsegs, p->tenants, MAX_TENANTS, &p->ntenants);
    for (uint32_t i = 0; i < p->nsegs; i++)
        clean(p->segs[i].name);
    for (uint32_t i = 0; i < p->ntenants; i++)
        clean(p->tenants[i].name);
    p->nstandbys = kvp_master_view_standbys(m, p->standbys, MAX_STANDBYS);
    p->nconfigs = kvp_master_view_configs(m, p->configs, MAX_CONFIGS);
    for (uint32_t i = 0; i < p->nconfigs; i++) {
        clean(p->configs[i].tenant);
        clean(p->configs[i].name);
    }
    for (uint32_t i = 0; i < p->nstandbys; i++) {
        clean(p->standbys[i].peer);
        clean(p->standbys[i].name);
    }
    sample *h = &st->hist[st->nhist++ % HISTORY];
    *h = (sample){.ms = real_ms(),
                  .hits = p->st[KVP_STAT_HITS],
                  .misses = p->st[KVP_STAT_MISSES],
                  .puts = p->st[KVP_STAT_PUTS],
                  .put_bytes = p->st[KVP_STAT_PUT_BYTES],
                  .hit_bytes = p->st[KVP_STAT_HIT_BYTES],
                  .requests = p->st[KVP_STAT_REQUESTS],
                  .evictions = p->st[KVP_STAT_EVICTIONS],
                  .pressure = p->st[KVP_STAT_SPILL_PRESSURE],
                  .used = p->st[KVP_STAT_USED],
                  .capacity = p->st[KVP_STAT_CAPACITY],
                  .objects = p->st[KVP_STAT_OBJECTS]};
    pthread_mutex_unlock(&st->mu);
}

/* ------------------------------------------------------------- reading */

/* A private copy of the picture (its arrays malloc'ed), for rendering
 * without the lock. 0, or -1 when out of memory. */
static int pic_copy(kvp_mstatus *st, picture *out)
{
    pthread_mutex_lock(&st->mu);
    *out = st->pic;
    out->segs = kvp_malloc((size_t)st->pic.nsegs * sizeof *out->segs + 1);
    out->tenants = kvp_malloc((size_t)st->pic.ntenants * sizeof *out->tenants + 1);
    out->configs = kvp_malloc((size_t)st->pic.nconfigs * sizeof *out->configs + 1);
    if (out->segs && out->tenants && out->configs) {
        memcpy(out->segs, st->pic.segs, (size_t)st->pic.nsegs * sizeof *out->segs);
        memcpy(out->tenants, st->pic.tenants, (size_t)st->pic.ntenants * sizeof *out->tenants);
        memcpy(out->configs, st->pic.configs, (size_t)st->pic.nconfigs * sizeof *out->configs);
    }
    pthread_mutex_unlock(&st->mu);
    if (!out->segs || !out->tenants || !out->configs) {
        kvp_free(out->segs);
        kvp_free(out->tenants);
        kvp_free(out->configs);
        return -1;
    }
    out->role = atomic_load(&st->role); /* a role change shows at once */
    return 0;
}

static void pic_free(picture *p)
{
    kvp_free(p->segs);
    kvp_free(p->tenants);
    kvp_free(p->configs);
}

static const char *role_name(int r)
{
    return r == KVP_MROLE_LEADER ? "leader" : r == KVP_MROLE_STANDBY ? "standby" : "single";
}

static int check(const kvp_mstatus *st, const picture *p, int need_serving, const char **why)
{
    uint64_t now = kvp_now_ms();
    if (p->role == KVP_MROLE_STANDBY) {
        if (need_serving) {
            *why = "standby: another master leads";
            return 0;
        }
        return 1; /* its follower publishes only on changes */
    }
    if (!p->at_ms || now - p->at_ms > STUCK_MS) {
        *why = p->at_ms ? "the master's loop has not run for 5 s" : "the master is starting";
        return 0;
    }
    (void)st;
    *why = "ok";
    return 1;
}

int kvp_mstatus_healthy(kvp_mstatus *st, const char **why)
{
    picture p;
    pthread_mutex_lock(&st->mu);
    p.at_ms = st->pic.at_ms;
    pthread_mutex_unlock(&st->mu);
    p.role = atomic_load(&st->role);
    return check(st, &p, 0, why);
}

int kvp_mstatus_ready(kvp_mstatus *st, const char **why)
{
    picture p;
    pthread_mutex_lock(&st->mu);
    p.at_ms = st->pic.at_ms;
    pthread_mutex_unlock(&st->mu);
    p.role = atomic_load(&st->role);
    return check(st, &p, 1, why);
}

static int probe(int ok, const char *why, kvp_buf *out)
{
    kvp_buf_printf(out, "%s\n", why);
    return ok ? 200 : 503;
}

int kvp_mstatus_healthz(void *ctx, kvp_buf *out, const char **ctype)
{
    const char *why;
    int ok = kvp_mstatus_healthy(ctx, &why);
    return probe(ok, why, out);
}

int kvp_mstatus_readyz(void *ctx, kvp_buf *out, const char **ctype)
{
    const char *why;
    int ok = kvp_mstatus_ready(ctx, &why);
    return probe(ok, why, out);
}

/* ------------------------------------------------------------- metrics */

/* The core's counters: name, type, help, enum kvp_stat index, tier label
 * (NULL: none). Families with several tiers are listed consecutively. */
static const struct core_metric {
    const char *name, *type, *help;
    int stat;
    const char *tier;
} core[] = {
    {"kvpool_objects", "gauge", "Objects readable in the pool.", KVP_STAT_OBJECTS, NULL},
    {"kvpool_bytes", "gauge", "Bytes of the readable objects (one copy).", KVP_STAT_BYTES, NULL},
    {"kvpool_capacity_bytes", "gauge", "Capacity of the mounted segments per tier.",
     KVP_STAT_CAPACITY, "dram"},
    {"kvpool_capacity_bytes", NULL, NULL, KVP_STAT_DISK_CAPACITY, "disk"},
    {"kvpool_used_bytes", "gauge", "Bytes in use per tier (DRAM: every replica, pending ones "
     "too; disk: the nodes' page files).", KVP_STAT_USED, "dram"},
    {"kvpool_used_bytes", NULL, NULL, KVP_STAT_DISK_USED, "disk"},
    {"kvpool_disk_objects", "gauge", "Objects with a durable copy on a node's SSD tier.",
     KVP_STAT_DISK_OBJECTS, NULL},
    {"kvpool_disk_object_bytes", "gauge", "Bytes of the objects with a durable SSD copy.",
     KVP_STAT_DISK_BYTES, NULL},
    {"kvpool_hits_total", "counter", "GET keys found.", KVP_STAT_HITS, NULL},
    {"kvpool_misses_total", "counter", "GET keys not found.", KVP_STAT_MISSES, NULL},
    {"kvpool_disk_hits_total", "counter", "GETs of objects only on disk (a load started).",
     KVP_STAT_DISK_HITS, NULL},
    {"kvpool_hit_bytes_total", "counter", "Bytes of the objects GET found.", KVP_STAT_HIT_BYTES,
     NULL},
    {"kvpool_puts_total", "counter", "Objects published.", KVP_STAT_PUTS, NULL},
    {"kvpool_put_bytes_total", "counter", "Bytes of the objects published.", KVP_STAT_PUT_BYTES,
     NULL},
    {"kvpool_evictions_total", "counter", "Objects evicted from DRAM.", KVP_STAT_EVICTIONS, NULL},
    {"kvpool_evicted_bytes_total", "counter", "Bytes evicted from DRAM.", KVP_STAT_EVICTED_BYTES,
     NULL},
    {"kvpool_spills_total", "counter", "DRAM victims made durable on a node's SSD tier.",
     KVP_STAT_SPILLS, NULL},
    {"kvpool_spill_failures_total", "counter", "Spills a node could not do (the victim was "
     "dropped).", KVP_STAT_SPILL_FAILS, NULL},
    {"kvpool_spilling", "gauge", "Objects being written to disk now.", KVP_STAT_SPILLING, NULL},
    {"kvpool_loads_total", "counter", "Loads from disk back into DRAM.", KVP_STAT_LOADS, NULL},
    {"kvpool_load_failures_total", "counter", "Loads that failed (record gone or corrupt).",
     KVP_STAT_LOAD_FAILS, NULL},
    {"kvpool_pressure_refusals_total", "counter", "Put replicas refused with -200 while spills "
     "free the room.", KVP_STAT_SPILL_PRESSURE, NULL},
    {"kvpool_leases", "gauge", "Active read leases.", KVP_STAT_LEASES, NULL},
    {"kvpool_pending_puts", "gauge", "Puts started and not yet ended.", KVP_STAT_PENDING, NULL},
    {"kvpool_put_timeouts_total", "counter", "Pending puts reclaimed by put_timeout.",
     KVP_STAT_PUT_TIMEOUTS, NULL},
    {"kvpool_put_revoked_total", "counter", "Pending puts revoked (explicitly, by a disconnect "
     "or an unmount).", KVP_STAT_PUT_REVOKED, NULL},
    {"kvpool_clients", "gauge", "Live clients.", KVP_STAT_CLIENTS, NULL},
    {"kvpool_clients_expired_total", "counter", "Clients dropped by the liveness TTL.",
     KVP_STAT_CLIENTS_EXPIRED, NULL},
    {"kvpool_segments", "gauge", "Mounted segments.", KVP_STAT_SEGMENTS, NULL},
    {"kvpool_requests_total", "counter", "Frames served.", KVP_STAT_REQUESTS, NULL},
    {"kvpool_bad_frames_total", "counter", "Frames refused as malformed.", KVP_STAT_BAD_FRAMES,
     NULL},
    {"kvpool_bad_replicas_total", "counter", "Replicas dropped after a reader's checksum "
     "mismatch.", KVP_STAT_BAD_REPLICAS, NULL},
    {"kvpool_disk_dropped_total", "counter", "Records the SSD tiers dropped (room, "
     "corruption).", KVP_STAT_DISK_DROPPED, NULL},
    {"kvpool_disk_registered_total", "counter", "Records nodes reported after mounting (warm "
     "restart).", KVP_STAT_DISK_REGISTERED, NULL},
    {"kvpool_disk_compacted_bytes_total", "counter", "Bytes compaction moved (the nodes' "
     "totals).", KVP_STAT_DISK_COMPACTED, NULL},
    {"kvpool_disk_compacted_pages_total", "counter", "Pages compaction reclaimed.",
     KVP_STAT_DISK_COMPACTED_PAGES, NULL},
    {"kvpool_disk_dropped_pages_total", "counter", "Pages dropped for room.",
     KVP_STAT_DISK_DROPPED_PAGES, NULL},
    {"kvpool_soft_pinned", "gauge", "Soft-pinned objects waiting on the soft lists.",
     KVP_STAT_SOFT_PINNED, NULL},
    {"kvpool_repl_followers", "gauge", "Standbys following the index.", KVP_STAT_REPL_FOLLOWERS,
     NULL},
    {"kvpool_repl_in_sync", "gauge", "Standbys a PUT_END waits for.", KVP_STAT_REPL_IN_SYNC,
     NULL},
    {"kvpool_repl_records_total", "counter", "Index records journaled to standbys.",
     KVP_STAT_REPL_SEQ, NULL},
    {"kvpool_repl_lag_records", "gauge", "Records the furthest-behind standby has not "
     "acknowledged.", KVP_STAT_REPL_LAG, NULL},
    {"kvpool_repl_sent_bytes_total", "counter", "Bytes sent to standbys.", KVP_STAT_REPL_BYTES,
     NULL},
    {"kvpool_adopted_total", "counter", "Objects a takeover kept from the previous leader.",
     KVP_STAT_ADOPTED, NULL},
    {"kvpool_parked", "gauge", "Adopted objects waiting for their node to mount.",
     KVP_STAT_PARKED, NULL},
    {"kvpool_adopt_dropped_total", "counter", "Adopted objects dropped (their node never came "
     "back).", KVP_STAT_ADOPT_DROPPED, NULL},
    {"kvpool_block_objects", "gauge", "Objects put with an engine block (indexed by its hash).",
     KVP_STAT_BLOCK_OBJECTS, NULL},
    {"kvpool_block_conflicts_total", "counter", "Puts whose block disagreed with their "
     "tenant's (stored without it).", KVP_STAT_BLOCK_CONFLICTS, NULL},
    {"kvpool_kv_events_total", "counter", "KV events recorded for routers.", KVP_STAT_KV_EVENTS,
     NULL},
    {"kvpool_kv_event_batches_total", "counter", "KV event batches closed.", KVP_STAT_KV_BATCHES,
     NULL},
    {"kvpool_kv_events_lost_total", "counter", "KV events lost for want of memory (a gap in "
     "their stream).", KVP_STAT_KV_LOST, NULL},
};

static const char *const refuse_names[KVP_MREFUSE__COUNT] = {
    "max_connections", "pre_hello", "per_address", "memory",
    "evicted",         "hello_timeout", "hello_backoff"};

static void write_segments(kvp_buf *b, const picture *p)
{
    static const struct {
        const char *name, *type, *help;
    } fam[] = {
        {"kvpool_segment_capacity_bytes", "gauge", "A segment's capacity per tier."},
        {"kvpool_segment_used_bytes", "gauge", "A segment's bytes in use per tier."},
        {"kvpool_segment_replicas", "gauge", "Replicas stored in a segment's DRAM."},
        {"kvpool_segment_largest_free_bytes", "gauge", "A segment's largest free DRAM extent."},
    };
    for (size_t f = 0; f < sizeof fam / sizeof fam[0]; f++) {
        kvp_prom_family(b, fam[f].name, fam[f].type, fam[f].help);
        for (uint32_t i = 0; i < p->nsegs; i++) {
            const kvp_mview_seg *s = &p->segs[i];
            char l[2 * KVP_PROM_PAIR_MAX + 1] = "", ld[sizeof l];
            kvp_prom_label(l, sizeof l, "segment", s->name, strlen(s->name));
            memcpy(ld, l, sizeof l);
            kvp_prom_label(l, sizeof l, "tier", "dram", 4);
            kvp_prom_label(ld, sizeof ld, "tier", "disk", 4);
            switch (f) {
            case 0:
                kvp_prom_u64(b, fam[f].name, l, s->capacity);
                kvp_prom_u64(b, fam[f].name, ld, s->disk_capacity);
                break;
            case 1:
                kvp_prom_u64(b, fam[f].name, l, s->used);
                kvp_prom_u64(b, fam[f].name, ld, s->disk_used);
                break;
            case 2: {
                char ls[256] = "";
                kvp_prom_label(ls, sizeof ls, "segment", s->name, strlen(s->name));
                kvp_prom_u64(b, fam[f].name, ls, s->replicas);
                break;
            }
            default: {
                char ls[256] = "";
                kvp_prom_label(ls, sizeof ls, "segment", s->name, strlen(s->name));
                kvp_prom_u64(b, fam[f].name, ls, s->largest_free);
            }
            }
        }
    }
}

static void write_tenants(kvp_buf *b, const picture *p)
{
    static const struct {
        const char *name, *type, *help;
    } fam[] = {
        {"kvpool_tenant_objects", "gauge", "A tenant's objects (pending ones too)."},
        {"kvpool_tenant_bytes", "gauge", "Value bytes of a tenant's objects, every tier."},
        {"kvpool_tenant_pool_bytes", "gauge", "DRAM a tenant's replicas hold."},
        {"kvpool_tenant_quota_bytes", "gauge", "A tenant's quota on DRAM (0 = none)."},
        {"kvpool_tenant_evictions_total", "counter", "Victims taken from a tenant."},
        {"kvpool_tenant_refused_total", "counter", "Put keys a tenant's quota refused."},
    };
    for (size_t f = 0; f < sizeof fam / sizeof fam[0]; f++) {
        kvp_prom_family(b, fam[f].name, fam[f].type, fam[f].help);
        for (uint32_t i = 0; i < p->ntenants; i++) {
            const kvp_mview_tenant *t = &p->tenants[i];
            char l[256] = "";
            kvp_prom_label(l, sizeof l, "tenant", t->name, strlen(t->name));
            uint64_t v[] = {t->objects,   t->bytes,     t->pool_bytes,
                            t->max_bytes, t->evictions, t->refused};
            kvp_prom_u64(b, fam[f].name, l, v[f]);
        }
    }
}

/* Per configuration (fingerprint in the keys): objects and bytes; a
 * tenant's "other" row has fingerprint="other" and name="". */
static void write_configs(kvp_buf *b, const picture *p)
{
    static const char *const fam[][2] = {
        {"kvpool_config_objects", "Published objects of a configuration (the @cfg:<fp> of "
                                  "connector keys)."},
        {"kvpool_config_bytes", "Value bytes of a configuration's objects."},
    };
    for (size_t f = 0; f < 2; f++) {
        kvp_prom_family(b, fam[f][0], "gauge", fam[f][1]);
        for (uint32_t i = 0; i < p->nconfigs; i++) {
            const kvp_mview_config *c = &p->configs[i];
            const char *fp = c->fp[0] ? c->fp : "other";
            char l[512] = "";
            kvp_prom_label(l, sizeof l, "tenant", c->tenant, strlen(c->tenant));
            kvp_prom_label(l, sizeof l, "name", c->name, strlen(c->name));
            kvp_prom_label(l, sizeof l, "fingerprint", fp, strlen(fp));
            kvp_prom_u64(b, fam[f][0], l, f ? c->bytes : c->objects);
        }
    }
}

static void write_service(kvp_mstatus *st, kvp_buf *b, const picture *p)
{
    kvp_prom_family(b, "kvpool_connections", "gauge", "Open client and node connections.");
    kvp_prom_u64(b, "kvpool_connections", NULL, p->svc.conns);
    kvp_prom_family(b, "kvpool_connections_refused_total", "counter",
                    "Connections refused or closed by a limit, by reason.");
    for (int i = 0; i < KVP_MREFUSE__COUNT; i++) {
        char l[64] = "";
        kvp_prom_label(l, sizeof l, "reason", refuse_names[i], strlen(refuse_names[i]));
        kvp_prom_u64(b, "kvpool_connections_refused_total", l, p->svc.refused[i]);
    }
    kvp_prom_family(b, "kvpool_input_waits_total", "counter",
                    "Times a connection waited for input memory.");
    kvp_prom_u64(b, "kvpool_input_waits_total", NULL, p->svc.input_waits);
    kvp_prom_family(b, "kvpool_input_used_bytes", "gauge", "Input memory in use.");
    kvp_prom_u64(b, "kvpool_input_used_bytes", NULL, p->svc.input_used);
    kvp_prom_family(b, "kvpool_input_budget_bytes", "gauge", "Input memory budget.");
    kvp_prom_u64(b, "kvpool_input_budget_bytes", NULL, p->svc.input_budget);
    if (p->svc.kv_events) {
        static const struct {
            const char *name, *help;
            size_t off;
        } kv[] = {
            {"kvpool_kv_event_batches_sent_total", "KV event batches published (ZeroMQ PUB).",
             offsetof(kvp_msvc, kv_sent)},
            {"kvpool_kv_event_batches_dropped_total", "KV event batches the publisher dropped "
             "(queue full): gaps its subscribers mend from a snapshot.",
             offsetof(kvp_msvc, kv_dropped)},
            {"kvpool_kv_event_replays_total", "Replay requests answered.",
             offsetof(kvp_msvc, kv_replays)},
            {"kvpool_kv_event_batches_replayed_total", "Batches sent in replay answers.",
             offsetof(kvp_msvc, kv_replayed)},
        };
        for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
            uint64_t v;
            memcpy(&v, (const char *)&p->svc + kv[i].off, sizeof v);
            kvp_prom_family(b, kv[i].name, "counter", kv[i].help);
            kvp_prom_u64(b, kv[i].name, NULL, v);
        }
    }
    kvp_prom_family(b, "kvpool_loop_longest_turn_seconds", "gauge",
                    "The master loop's longest turn so far.");
    kvp_prom_f64(b, "kvpool_loop_longest_turn_seconds", NULL,
                 (double)p->svc.longest_turn_ms / 1000.0);

    kvp_prom_family(b, "kvpool_request_duration_seconds", "histogram",
                    "Time the master took to serve a request, by op.");
    for (uint16_t op = 0; op < KVP_OP__MAX; op++) {
        const char *name = kvp_op_name(op);
        if (!name || !atomic_load_explicit(&st->lat[op].count, memory_order_relaxed))
            continue;
        char l[64] = "";
        kvp_prom_label(l, sizeof l, "op", name, strlen(name));
        kvp_prom_hist_write(b, "kvpool_request_duration_seconds", l, &st->lat[op]);
    }
    kvp_prom_family(b, "kvpool_errors_total", "counter",
                    "Requests answered with an error for the whole request, by code.");
    for (size_t i = 0; i < NERR; i++) {
        uint64_t n = atomic_load_explicit(&st->errs[i], memory_order_relaxed);
        if (!n)
            continue;
        const char *name = kvp_err_name(err_codes[i]);
        char l[96] = "";
        kvp_prom_label(l, sizeof l, "code", name, strlen(name));
        kvp_prom_u64(b, "kvpool_errors_total", l, n);
    }
    uint64_t other = atomic_load_explicit(&st->errs_other, memory_order_relaxed);
    if (other)
        kvp_prom_u64(b, "kvpool_errors_total", "code=\"OTHER\"", other);
}

/* What clients moved per data path and op, as of their last heartbeats
 * (each live client's last report plus every departed client's). */
static void write_paths(kvp_buf *b, const picture *p)
{
    static const struct {
        const char *name, *help;
        int field[2]; /* put, get: offsets in KVP_STAT_PATH */
    } fam[] = {
        {"kvpool_client_bytes_total", "Bytes clients moved to and from segments, by data path "
         "and op, as of their last heartbeats.", {0, 1}},
        {"kvpool_client_transfers_total", "Replica transfers clients made, by data path and op, "
         "as of their last heartbeats.", {2, 3}},
    };
    static const char *const ops[2] = {"put", "get"};
    for (size_t f = 0; f < sizeof fam / sizeof fam[0]; f++) {
        kvp_prom_family(b, fam[f].name, "counter", fam[f].help);
        for (int path = 0; path < KVP_STAT_NPATHS; path++)
            for (int o = 0; o < 2; o++) {
                char l[64] = "";
                const char *pn = kvp_path_name(path);
                kvp_prom_label(l, sizeof l, "path", pn, strlen(pn));
                kvp_prom_label(l, sizeof l, "op", ops[o], strlen(ops[o]));
                kvp_prom_u64(b, fam[f].name, l, p->st[KVP_STAT_PATH(path, fam[f].field[o])]);
            }
    }
}

static void write_metrics(kvp_mstatus *st, kvp_buf *b, const picture *p)
{
    char l[128] = "";
    kvp_prom_family(b, "kvpool_build_info", "gauge", "The running kvpool's version.");
    kvp_prom_label(l, sizeof l, "version", kvp_version(), strlen(kvp_version()));
    kvp_prom_u64(b, "kvpool_build_info", l, 1);
    kvp_prom_family(b, "kvpool_start_time_seconds", "gauge",
                    "When the master started, seconds since the epoch.");
    kvp_prom_f64(b, "kvpool_start_time_seconds", NULL, (double)st->start_ms / 1000.0);
    kvp_prom_family(b, "kvpool_master_role", "gauge",
                    "1 for this master's role in its cluster (single, standby, leader).");
    for (int r = KVP_MROLE_SINGLE; r <= KVP_MROLE_LEADER; r++) {
        char rl[64] = "";
        kvp_prom_label(rl, sizeof rl, "role", role_name(r), strlen(role_name(r)));
        kvp_prom_u64(b, "kvpool_master_role", rl, p->role == r);
    }
    for (size_t i = 0; i < sizeof core / sizeof core[0]; i++) {
        const struct core_metric *c = &core[i];
        if (c->type)
            kvp_prom_family(b, c->name, c->type, c->help);
        char tl[32] = "";
        if (c->tier)
            kvp_prom_label(tl, sizeof tl, "tier", c->tier, strlen(c->tier));
        kvp_prom_u64(b, c->name, tl, p->st[c->stat]);
    }
    write_paths(b, p);
    write_segments(b, p);
    write_tenants(b, p);
    write_configs(b, p);
    write_service(st, b, p);
}

void kvp_mstatus_write_metrics(kvp_mstatus *st, kvp_buf *out)
{
    picture p;
    if (pic_copy(st, &p) != 0) {
        out->err = out->err ? out->err : KVP_ENOMEM;
        return;
    }
    write_metrics(st, out, &p);
    pic_free(&p);
}

int kvp_mstatus_metrics(void *ctx, kvp_buf *out, const char **ctype)
{
    *ctype = KVP_PROM_CTYPE;
    kvp_mstatus_write_metrics(ctx, out);
    return 200;
}

/* ------------------------------------------------------------ /api/stats */

static json_t *u64(uint64_t v) { return json_integer((json_int_t)(v > INT64_MAX ? INT64_MAX : v)); }

static json_t *api_segments(const picture *p)
{
    json_t *a = json_array();
    for (uint32_t i = 0; i < p->nsegs; i++) {
        const kvp_mview_seg *s = &p->segs[i];
        char id[24];
        snprintf(id, sizeof id, "%016llx", (unsigned long long)s->id);
        json_array_append_new(
            a, json_pack("{s:s,s:s,s:o,s:o,s:o,s:o,s:o,s:o,s:o}", "id", id, "name", s->name,
                         "capacity", u64(s->capacity), "used", u64(s->used), "replicas",
                         u64(s->replicas), "largest_free", u64(s->largest_free),
                         "disk_capacity", u64(s->disk_capacity), "disk_used", u64(s->disk_used),
                         "disk_objects", u64(s->disk_objects)));
    }
    return a;
}

static json_t *api_tenants(const picture *p)
{
    json_t *a = json_array();
    for (uint32_t i = 0; i < p->ntenants; i++) {
        const kvp_mview_tenant *t = &p->tenants[i];
        json_array_append_new(
            a, json_pack("{s:s,s:o,s:o,s:o,s:o,s:o,s:o,s:o}", "name", t->name, "objects",
                         u64(t->objects), "bytes", u64(t->bytes), "pool_bytes", u64(t->pool_bytes),
                         "max_bytes", u64(t->max_bytes), "max_objects", u64(t->max_objects),
                         "evictions", u64(t->evictions), "refused", u64(t->refused)));
    }
    return a;
}

/* [{tenant, name, fingerprint ("" = the tenant's other), objects, bytes}] */
static json_t *api_configs(const picture *p)
{
    json_t *a = json_array();
    for (uint32_t i = 0; i < p->nconfigs; i++) {
        const kvp_mview_config *c = &p->configs[i];
        json_array_append_new(a, json_pack("{s:s,s:s,s:s,s:o,s:o}", "tenant", c->tenant, "name",
                                           c->name, "fingerprint", c->fp, "objects",
                                           u64(c->objects), "bytes", u64(c->bytes)));
    }
    return a;
}

static json_t *api_history(kvp_mstatus *st)
{
    json_t *a = json_array();
    pthread_mutex_lock(&st->mu);
    uint64_t have = st->nhist < HISTORY ? st->nhist : HISTORY;
    uint64_t n = have < API_HISTORY ? have : API_HISTORY;
    sample *copy = kvp_malloc(n * sizeof *copy + 1);
    if (copy)
        for (uint64_t i = 0; i < n; i++)
            copy[i] = st->hist[(st->nhist - n + i) % HISTORY];
    pthread_mutex_unlock(&st->mu);
    for (uint64_t i = 0; copy && i < n; i++) {
        const sample *h = &copy[i];
        json_array_append_new(
            a, json_pack("{s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o}", "t", u64(h->ms),
                         "hits", u64(h->hits), "misses", u64(h->misses), "puts", u64(h->puts),
                         "put_bytes", u64(h->put_bytes), "hit_bytes", u64(h->hit_bytes),
                         "requests", u64(h->requests), "evictions", u64(h->evictions),
                         "pressure", u64(h->pressure), "used", u64(h->used), "capacity",
                         u64(h->capacity), "objects", u64(h->objects)));
    }
    kvp_free(copy);
    return a;
}

static json_t *api_warnings(void)
{
    kvp_log_recent_line *l = kvp_malloc(KVP_LOG_RECENT * sizeof *l);
    json_t *a = json_array();
    size_t n = l ? kvp_log_recent(l, KVP_LOG_RECENT) : 0;
    for (size_t i = 0; i < n; i++) {
        clean(l[i].mod);
        clean(l[i].msg);
        json_array_append_new(a, json_pack("{s:o,s:s,s:s,s:s}", "t", u64(l[i].ms), "level",
                                           kvp_log_level_name(l[i].level), "component", l[i].mod,
                                           "msg", l[i].msg));
    }
    kvp_free(l);
    return a;
}

static json_t *api_standbys(const picture *p)
{
    json_t *a = json_array();
    for (uint32_t i = 0; i < p->nstandbys; i++) {
        const kvp_mview_standby *s = &p->standbys[i];
        json_array_append_new(a, json_pack("{s:s,s:s,s:o,s:o,s:b}", "peer", s->peer, "name",
                                           s->name, "acked", u64(s->acked), "lag", u64(s->lag),
                                           "in_sync", s->in_sync));
    }
    return a;
}

/* {"shm": {"put_bytes", "get_bytes", "put_ops", "get_ops"}, "tcp": ..., "ucx": ...} */
static json_t *api_paths(const picture *p)
{
    json_t *o = json_object();
    for (int path = 0; path < KVP_STAT_NPATHS; path++)
        json_object_set_new(
            o, kvp_path_name(path),
            json_pack("{s:o,s:o,s:o,s:o}", "put_bytes", u64(p->st[KVP_STAT_PATH(path, 0)]),
                      "get_bytes", u64(p->st[KVP_STAT_PATH(path, 1)]), "put_ops",
                      u64(p->st[KVP_STAT_PATH(path, 2)]), "get_ops",
                      u64(p->st[KVP_STAT_PATH(path, 3)])));
    return o;
}

static json_t *api_ops(kvp_mstatus *st)
{
    json_t *a = json_array();
    for (uint16_t op = 0; op < KVP_OP__MAX; op++) {
        const kvp_prom_hist *h = &st->lat[op];
        uint64_t n = atomic_load_explicit(&h->count, memory_order_relaxed);
        if (!n || !kvp_op_name(op))
            continue;
        json_array_append_new(
            a, json_pack("{s:s,s:o,s:f,s:f}", "op", kvp_op_name(op), "count", u64(n), "p50_ms",
                         kvp_prom_hist_quantile(h, 0.5) * 1e3, "p99_ms",
                         kvp_prom_hist_quantile(h, 0.99) * 1e3));
    }
    return a;
}

int kvp_mstatus_api(void *ctx, kvp_buf *out, const char **ctype)
{
    kvp_mstatus *st = ctx;
    picture p;
    if (pic_copy(st, &p) != 0)
        return out->err = KVP_ENOMEM, 500;
    json_t *counters = json_object();
    for (unsigned i = 0; i < KVP_STAT__COUNT; i++)
        json_object_set_new(counters, kvp_stat_name(i), u64(p.st[i]));
    json_t *refused = json_object();
    for (int i = 0; i < KVP_MREFUSE__COUNT; i++)
        json_object_set_new(refused, refuse_names[i], u64(p.svc.refused[i]));
    char id[24];
    snprintf(id, sizeof id, "%016llx", (unsigned long long)p.svc.master_id);
    const char *why;
    int ready = check(st, &p, 1, &why);
    json_t *j = json_pack(
        "{s:s,s:s,s:s,s:s,s:b,s:s,s:o,s:o,s:o,s:o,s:{s:o,s:o,s:o,s:o},s:o,s:o,s:o,s:o,s:o,s:o,"
        "s:o,s:o}",
        "version", kvp_version(), "listen", st->listen, "role", role_name(p.role), "master_id", id,
        "ready", ready, "why", why, "start_ms", u64(st->start_ms), "now_ms", u64(real_ms()),
        "published_ms_ago", u64(p.at_ms ? kvp_now_ms() - p.at_ms : 0), "counters", counters,
        "service", "connections", u64(p.svc.conns), "refused", refused, "input_waits",
        u64(p.svc.input_waits), "longest_turn_ms", u64(p.svc.longest_turn_ms), "segments",
        api_segments(&p), "tenants", api_tenants(&p), "configs", api_configs(&p), "history",
        api_history(st), "warnings",
        api_warnings(), "ops", api_ops(st), "repl",
        json_pack("{s:o,s:o,s:o,s:o,s:o}", "followers", u64(p.st[KVP_STAT_REPL_FOLLOWERS]),
                  "in_sync", u64(p.st[KVP_STAT_REPL_IN_SYNC]), "seq", u64(p.st[KVP_STAT_REPL_SEQ]),
                  "lag", u64(p.st[KVP_STAT_REPL_LAG]), "standbys", api_standbys(&p)),
        "paths", api_paths(&p));
    pic_free(&p);
    if (!j)
        return out->err = KVP_ENOMEM, 500;
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!text)
        return out->err = KVP_ENOMEM, 500;
    kvp_buf_put(out, text, strlen(text));
    free(text);
    *ctype = "application/json";
    return 200;
}

/* ------------------------------------------------------ /get_all_segments */

/* Mooncake's master answers GET /get_all_segments on its admin port with
 * the mounted segments' names, one a line, each ended by '\n' (an empty
 * body: none mounted yet), as text/plain; version=0.0.4, and 503 while its
 * service plane is not active. SGLang's check_server polls it until the
 * body is not empty. We answer the same from the published picture (at
 * most MAX_SEGS names); a standby answers 503 as Mooncake's does. A name
 * is a peer's bytes: anything outside printable ASCII shows as '?', so no
 * name can add a line. */
int kvp_mstatus_segments(void *ctx, kvp_buf *out, const char **ctype)
{
    kvp_mstatus *st = ctx;
    picture p;
    *ctype = "text/plain; version=0.0.4";
    if (pic_copy(st, &p) != 0)
        return out->err = KVP_ENOMEM, 500;
    int code = 200;
    if (p.role == KVP_MROLE_STANDBY) {
        kvp_buf_printf(out, "service plane is not active\n");
        code = 503;
    } else {
        for (uint32_t i = 0; i < p.nsegs; i++) {
            char name[sizeof p.segs[i].name];
            memcpy(name, p.segs[i].name, sizeof name);
            name[sizeof name - 1] = '\0';
            clean(name);
            kvp_buf_printf(out, "%s\n", name);
        }
    }
    pic_free(&p);
    return code;
}

int kvp_mstatus_page(void *ctx, kvp_buf *out, const char **ctype)
{
    (void)ctx;
    kvp_buf_put(out, kvp_mstatus_html, strlen(kvp_mstatus_html));
    *ctype = "text/html; charset=utf-8";
    return 200;
}
