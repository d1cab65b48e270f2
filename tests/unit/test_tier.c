/*
 * test_tier.c -- a storage node's SSD tier (src/node/tier.c) driven by the
 * master's DISK_CMD bodies, on a real segment and real files: a FORGET
 * names one record (rec, size, checksum), so one that reaches the node
 * after the key was spilled again -- a stale FORGET -- leaves the newer
 * record alone, also when the newer write is still queued and across node
 * restarts (the records' ids come back in the HAVE reports after a rescan),
 * while a FORGET naming the live record removes it for good.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/config.h"
#include "harness.h"
#include "kvpool.h"
#include "node/segment.h"
#include "node/tier.h"
#include "proc.h"
#include "proto/proto.h"

#define MiB (1024ull * 1024)
#define SEG_ID 0x5E6ull
#define VAL 20000u /* bytes of a value (5 pages) */

/* ------------------------------------------------------------ fixture */

/* A report the tier sent, its key copied. */
typedef struct rep {
    uint8_t what;
    int32_t status;
    char key[32];
    uint64_t size, csum;
    uint32_t page, rec;
} rep;

typedef struct fx {
    char dir[64];
    kvp_config cfg;
    kvp_segment *seg;
    kvp_tier *t;
    rep r[256];
    int nr;
} fx;

static int fx_open_tier(fx *f)
{
    char err[512];
    int rc = kvp_tier_open(&f->cfg, f->seg, SEG_ID, &f->t, err, sizeof err);
    if (rc)
        fprintf(stderr, "    kvp_tier_open: %s (%s)\n", err, kvp_err_name(rc));
    return rc;
}

static int fx_start(fx *f)
{
    memset(f, 0, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/kvp-tier-XXXXXX");
    REQUIRE(mkdtemp(f->dir) != NULL);
    kvp_config_defaults(&f->cfg);
    f->cfg.enable_offload = 1;
    snprintf(f->cfg.offload_dir, sizeof f->cfg.offload_dir, "%s", f->dir);
    f->cfg.offload_capacity = 32 * MiB;
    f->cfg.offload_page_size = 2 * MiB;
    char err[512];
    REQUIRE(kvp_segment_create(4 * MiB, "test-tier", &f->seg, err, sizeof err) == 0);
    return fx_open_tier(f);
}

static void fx_stop(fx *f)
{
    kvp_tier_close(f->t);
    kvp_segment_destroy(f->seg);
    tp_rm_dir(f->dir);
}

/* A node restart: the tier closed (its writes made durable) and opened
 * again on the same directory, what it held reported (HAVE). */
static int fx_restart(fx *f)
{
    kvp_tier_close(f->t);
    f->t = NULL;
    REQUIRE(fx_open_tier(f) == 0);
    kvp_tier_register(f->t);
    return 0;
}

/* One DISK_CMD body of n entries, as the master sends it. */
static void command(fx *f, const kvp_disk_ent *e, uint32_t n)
{
    kvp_buf b;
    kvp_buf_init(&b, 1 << 20);
    kvp_msg_disk m = {SEG_ID, n, (kvp_disk_ent *)e};
    kvp_enc_disk(&b, &m);
    kvp_tier_command(f->t, b.data, (uint32_t)b.len);
    kvp_buf_free(&b);
}

static kvp_disk_ent ent(uint8_t what, const char *key, uint64_t seed, uint32_t page,
                        uint64_t gen, uint32_t rec)
{
    uint8_t *v = malloc(VAL);
    tp_fill(v, VAL, seed);
    uint64_t cs = XXH3_64bits(v, VAL);
    free(v);
    return (kvp_disk_ent){what, 0, {(const uint8_t *)"default", 7},
                          {(const uint8_t *)key, (uint32_t)strlen(key)}, VAL, cs, page, gen,
                          rec};
}

/* The value of seed into the segment at page (the DRAM replica to spill). */
static void stage(fx *f, uint32_t page, uint64_t seed)
{
    tp_fill(kvp_segment_base(f->seg) + ((uint64_t)page << 12), VAL, seed);
}

/* Whether the segment at page holds the value of seed (a load's target). */
static int staged(fx *f, uint32_t page, uint64_t seed)
{
    uint8_t *v = malloc(VAL);
    tp_fill(v, VAL, seed);
    int ok = !memcmp(kvp_segment_base(f->seg) + ((uint64_t)page << 12), v, VAL);
    free(v);
    return ok;
}

static int take_one(void *ctx, const uint8_t *body, size_t len)
{
    fx *f = ctx;
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    kvp_arena a;
    kvp_arena_init(&a, len * 2 + 4096);
    kvp_msg_disk d;
    int rc = kvp_dec_disk(body, (uint32_t)len, &l, &a, &d);
    if (rc == 0 && d.segment_id != SEG_ID)
        rc = -1;
    for (uint32_t i = 0; rc == 0 && i < d.n; i++) {
        const kvp_disk_ent *e = &d.e[i];
        if (e->what == KVP_DISK_USAGE || f->nr == 256)
            continue;
        rep *r = &f->r[f->nr++];
        r->what = e->what;
        r->status = e->status;
        snprintf(r->key, sizeof r->key, "%.*s", (int)e->key.len, (const char *)e->key.p);
        r->size = e->size;
        r->csum = e->checksum;
        r->page = e->page;
        r->rec = e->rec;
    }
    kvp_arena_free(&a);
    return rc == 0 ? 0 : -1;
}

/* Waits (10 s at most) for the next report of kind what about key; it and
 * every report before it are consumed. NULL when none came. */
static const rep *wait_report(fx *f, uint8_t what, const char *key)
{
    static rep got;
    for (int round = 0; round < 2000; round++) {
        if (kvp_tier_take(f->t, take_one, f) != 0)
            return NULL;
        for (int i = 0; i < f->nr; i++)
            if (f->r[i].what == what && !strcmp(f->r[i].key, key)) {
                got = f->r[i];
                memmove(f->r, f->r + i + 1, (size_t)(f->nr - i - 1) * sizeof f->r[0]);
                f->nr -= i + 1;
                return &got;
            }
        usleep(5000);
    }
    return NULL;
}

/* The HAVE reports waiting now (after fx_restart: one per live record):
 * how many name key, the last one's rec in *rec. */
static int haves(fx *f, const char *key, uint32_t *rec)
{
    REQUIRE(kvp_tier_take(f->t, take_one, f) == 0);
    int n = 0;
    for (int i = 0; i < f->nr; i++)
        if (f->r[i].what == KVP_DISK_HAVE && !strcmp(f->r[i].key, key)) {
            n++;
            *rec = f->r[i].rec;
        }
    f->nr = 0;
    return n;
}

/* A LOAD of key into page gen (expecting the value of seed): the LOADED
 * status, and whether the page then holds that value. */
static int32_t load(fx *f, const char *key, uint64_t seed, uint32_t page, int *bytes_ok)
{
    memset(kvp_segment_base(f->seg) + ((uint64_t)page << 12), 0, VAL);
    kvp_disk_ent e = ent(KVP_DISK_LOAD, key, seed, page, 900 + page, 0);
    command(f, &e, 1);
    const rep *r = wait_report(f, KVP_DISK_LOADED, key);
    if (!r)
        return INT32_MIN;
    *bytes_ok = staged(f, page, seed);
    return r->status;
}

static uint32_t spill(fx *f, const char *key, uint64_t seed, uint32_t page, uint64_t gen)
{
    stage(f, page, seed);
    kvp_disk_ent e = ent(KVP_DISK_SPILL, key, seed, page, gen, 0);
    command(f, &e, 1);
    const rep *r = wait_report(f, KVP_DISK_SPILLED, key);
    if (!r || r->status != 0 || r->page != page)
        return 0;
    return r->rec;
}

static kvp_tier_stats tstats(fx *f)
{
    kvp_tier_stats s;
    kvp_tier_get_stats(f->t, &s);
    return s;
}

/* -------------------------------------------------------------- tests */

TEST(a_stale_forget_leaves_the_newer_record_across_restarts)
{
    fx f;
    CHECK_EQ(fx_start(&f), 0);
    int ok = 0;
    /* the key spilled twice: two records, each reported with its id */
    uint32_t r1 = spill(&f, "k", 1, 0, 11);
    uint32_t r2 = spill(&f, "k", 2, 16, 12);
    CHECK(r1 != 0 && r2 != 0 && r1 != r2);
    /* a FORGET queued for the first record, delivered now: ignored */
    kvp_disk_ent fg1 = ent(KVP_DISK_FORGET, "k", 1, 0, 0, r1);
    command(&f, &fg1, 1);
    CHECK_EQ(tstats(&f).forget_stale, 1);
    CHECK_EQ(tstats(&f).forgets, 0);
    CHECK_EQ(load(&f, "k", 2, 32, &ok), 0);
    CHECK(ok);
    /* a spill and a FORGET of the record it replaces in one frame: the
     * newer write survives whether or not it is durable yet */
    stage(&f, 48, 3);
    kvp_disk_ent two[2] = {ent(KVP_DISK_SPILL, "k", 3, 48, 13, 0),
                           ent(KVP_DISK_FORGET, "k", 2, 0, 0, r2)};
    command(&f, two, 2);
    const rep *sp = wait_report(&f, KVP_DISK_SPILLED, "k");
    CHECK(sp && sp->status == 0);
    uint32_t r3 = sp->rec;
    CHECK(r3 != r1 && r3 != r2);
    CHECK_EQ(load(&f, "k", 3, 64, &ok), 0);
    CHECK(ok);
    /* a restart: the rescan reports the live record under the same id */
    CHECK_EQ(fx_restart(&f), 0);
    uint32_t rec = 0;
    CHECK_EQ(haves(&f, "k", &rec), 1);
    CHECK_EQ(rec, r3);
    command(&f, &fg1, 1);
    kvp_disk_ent fg2 = ent(KVP_DISK_FORGET, "k", 2, 0, 0, r2);
    command(&f, &fg2, 1);
    /* the right id with another value is not the record either */
    kvp_disk_ent fgx = ent(KVP_DISK_FORGET, "k", 2, 0, 0, r3);
    command(&f, &fgx, 1);
    CHECK_EQ(tstats(&f).forget_stale, 3);
    CHECK_EQ(load(&f, "k", 3, 64, &ok), 0);
    CHECK(ok);
    CHECK_EQ(fx_restart(&f), 0);
    CHECK_EQ(haves(&f, "k", &rec), 1);
    CHECK_EQ(rec, r3);
    /* the FORGET naming the live record removes it, for good */
    kvp_disk_ent fg3 = ent(KVP_DISK_FORGET, "k", 3, 0, 0, r3);
    command(&f, &fg3, 1);
    CHECK_EQ(tstats(&f).forgets, 1);
    CHECK_EQ(load(&f, "k", 3, 64, &ok), KVP_EOBJECT_NOT_FOUND);
    command(&f, &fg3, 1);
    CHECK_EQ(tstats(&f).forget_missing, 1);
    CHECK_EQ(fx_restart(&f), 0);
    CHECK_EQ(haves(&f, "k", &rec), 0);
    CHECK_EQ(load(&f, "k", 3, 64, &ok), KVP_EOBJECT_NOT_FOUND);
    /* a new record after the restart gets a new id */
    uint32_t r4 = spill(&f, "k", 4, 0, 14);
    CHECK(r4 != 0 && r4 != r1 && r4 != r2 && r4 != r3);
    fx_stop(&f);
}
