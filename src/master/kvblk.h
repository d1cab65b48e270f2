/*
 * kvblk.h -- the master's view of engine KV blocks (internal to src/master):
 * the block index behind LOOKUP_HASHES and KV_SNAPSHOT, and the KV events
 * routers subscribe to (master/kvev.h publishes them).
 *
 * A put may say which block of an engine a key holds a part of
 * (kvp_blkinfo): the block's hash (vLLM's int form), its KV cache group,
 * and how many objects make the block (`parts`: each TP/PP/PCP rank stores
 * its own). Such objects carry the hash in their record (obj.h) and are
 * indexed by (tenant, hash, group). A block is in a tier (DRAM, disk) when
 * `parts` of its objects are; that is what a lookup counts and what the
 * events announce.
 *
 * Events, when on. The master calls kvp_kvblk_sync whenever an object may
 * have entered or left a tier (published, evicted, spilled, loaded,
 * removed, its node lost...); sync compares what the object is now with
 * what it counted for in the events so far (o->ev_dram / o->ev_disk) and
 * records BlockStored when its block's count in a tier reaches `parts`,
 * BlockRemoved when it falls from it. So an event is recorded exactly at
 * the edges, whatever the order objects come and go in, and a block is
 * announced only while a get would find all of its parts. Events go to the
 * stream of the object's tenant (its topic); kvp_kvblk_take closes the
 * open batches, numbers them per stream, and hands them out. A stream's
 * first batch of this master instance starts with AllBlocksCleared, and
 * its sequence numbers start at the wall clock in microseconds, so a
 * subscriber sees a restarted master as a gap, never as old numbers.
 *
 * Parts and block size are per (tenant, group): the first put of a group
 * sets them; a put that disagrees while the tenant exists keeps its object
 * but not its block (counted in `conflicts`, logged): one model per tenant.
 *
 * Not thread-safe: the master's loop thread only.
 */
#ifndef KVP_KVBLK_H
#define KVP_KVBLK_H

#include <stdint.h>

#include "master/kvev.h"
#include "master/obj.h"
#include "proto/proto.h"

typedef struct kvp_kvblk kvp_kvblk;

/* Where an object is now: KVP_TIER_DRAM | KVP_TIER_DISK (the master's rule). */
typedef unsigned (*kvp_kvblk_tiers_fn)(void *ctx, const kvp_obj *o);

/* A tenant's name (the topic of its stream), borrowed until it is released. */
typedef const char *(*kvp_kvblk_name_fn)(void *ctx, uint16_t t, size_t *len);

/* events: record events (else only the index is kept); tiers and name get
 * ctx. 0 or KVP_ENOMEM. */
int kvp_kvblk_create(uint32_t max_tenants, int events, kvp_kvblk_tiers_fn tiers,
                     kvp_kvblk_name_fn name, void *ctx, kvp_kvblk **out);
void kvp_kvblk_destroy(kvp_kvblk *b);
int kvp_kvblk_events(const kvp_kvblk *b);

/*
 * Before creating a record for a put's key with block info bi in tenant t:
 * 1 = give the record a block hash (then kvp_kvblk_insert it), 0 = store
 * the object without one (no info, a disagreement with the tenant's group,
 * or no memory for the index), KVP_EINVALID_PARAMS = bad info (group >
 * KVP_OBJ_MAX_GROUP, parts or block_size 0).
 */
int kvp_kvblk_admit(kvp_kvblk *b, uint16_t t, const kvp_blkinfo *bi);
/* Tenant t's parts and block size for group g (0 when the group has none). */
int kvp_kvblk_group(const kvp_kvblk *b, uint16_t t, uint8_t g, uint16_t *parts,
                    uint32_t *block_size);
/* Room for one more kvp_kvblk_insert (adopting an object that has a block).
 * 0 or KVP_ENOMEM. */
int kvp_kvblk_reserve(kvp_kvblk *b);
/* o->blk set, hash written (obj.h), group and tenant set: index it. Never
 * fails after kvp_kvblk_admit returned 1 (which reserved the room). */
void kvp_kvblk_insert(kvp_kvblk *b, kvp_obj *o);
/* o leaves (destroyed): its events settle as "in no tier", then it is
 * unindexed. */
void kvp_kvblk_remove(kvp_kvblk *b, kvp_obj *o);

/* o may have changed tiers: record the edges (see above). parent: the
 * block's parent hash when has_parent (a publication: BlockStored carries
 * it), else none. */
void kvp_kvblk_sync(kvp_kvblk *b, kvp_obj *o, uint64_t parent, int has_parent);
/* AllBlocksCleared on tenant t's stream (remove_all emptied it, a start). */
void kvp_kvblk_cleared(kvp_kvblk *b, uint16_t t);
/* Objects of tenant t counted in the events (a tier bit set). */
uint64_t kvp_kvblk_announced(const kvp_kvblk *b, uint16_t t);
/* Tenant t is being released (it holds nothing; its name is still valid):
 * its group table is forgotten, what its stream recorded is closed and
 * kept for the next take under its name, and the stream starts over (a new
 * first batch, AllBlocksCleared, a later seq) if the slot is used again. */
void kvp_kvblk_tenant_gone(kvp_kvblk *b, uint16_t t);

/*
 * Closes the open batches and hands each to sink(ctx, topic, seq, ev, n),
 * a stream's in order, then forgets them. The sink copies what it keeps.
 */
typedef void (*kvp_kvblk_sink)(void *ctx, const char *topic, size_t topic_len, uint64_t seq,
                               const kvp_kvev *ev, uint32_t n);
void kvp_kvblk_take(kvp_kvblk *b, uint64_t wall_us, kvp_kvblk_sink sink, void *ctx);
/* Events recorded and not yet taken (the service publishes at most once a
 * millisecond while this is under a bound). */
uint64_t kvp_kvblk_pending(const kvp_kvblk *b);
/* Closes tenant t's open batch now (numbered, handed out at the next take)
 * and returns the seq of its stream's last batch (0: none yet). */
uint64_t kvp_kvblk_close(kvp_kvblk *b, uint16_t t, uint64_t wall_us);

/* Leading blocks of chain c of tenant t in DRAM, on disk, in either. */
void kvp_kvblk_lookup(const kvp_kvblk *b, uint16_t t, const kvp_hchain *c, kvp_hprefix *out);

/*
 * Tenant t's blocks as announced (events on), or as they are (off): calls
 * fn(ctx, hash, group, tier) once per block and tier. Returns the count.
 */
uint64_t kvp_kvblk_snapshot(kvp_kvblk *b, uint16_t t,
                            void (*fn)(void *ctx, uint64_t hash, uint8_t group, uint8_t tier),
                            void *ctx);

typedef struct kvp_kvblk_stats {
    uint64_t objects;   /* objects indexed by block */
    uint64_t events;    /* events recorded */
    uint64_t batches;   /* batches closed */
    uint64_t lost;      /* events lost (no memory): a gap in their stream */
    uint64_t conflicts; /* puts whose block info disagreed with their tenant's */
    uint64_t index_bytes; /* the block index's tables */
} kvp_kvblk_stats;
void kvp_kvblk_stats_get(const kvp_kvblk *b, kvp_kvblk_stats *st);

/* Self-check for tests (between requests): the index holds stats.objects
 * entries, every tenant's announced count matches its objects' event bits,
 * and (events on) every object's bits say where it is now. 0 if so. */
int kvp_kvblk_check(const kvp_kvblk *b);

#endif
