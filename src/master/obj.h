/*
 * obj.h -- the master's object record (internal to src/master).
 *
 * One record per object, allocated with kvp_salloc in one piece:
 *   [struct kvp_obj 64 B][block hash 8 B, if blk][key bytes][pad to 4]
 *   [kvp_orep x rep_cap]
 * For a 100-byte key and one replica that is 176 bytes (184 with malloc's
 * overhead), the bulk of the <= 200 B/object budget: so the header stays
 * 64 B (state, nrep, rep_cap and two soft-pin bits share a byte, disk_seg is
 * 16 bits, the soft pin's end shares a word with the size) although it holds
 * the disk record's id and the soft pin too. The block hash (an engine's
 * KV block this object is one part of, for KV events and LOOKUP_HASHES,
 * master/kvblk) costs 8 B only to objects put with one; its group and its
 * event bits share the size's word.
 *
 * Field ownership: the master loop thread only.
 */
#ifndef KVP_OBJ_H
#define KVP_OBJ_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "proto/proto.h" /* KVP_MAX_REPLICAS */

enum { KVP_OBJ_PENDING = 1, KVP_OBJ_COMPLETE = 2 };
#define KVP_OBJ_MAX_SIZE (1ull << 32) /* bytes: the size field's width */
#define KVP_OBJ_MAX_GROUP 31          /* a block's group: the group field's width */
/* Soft pins are kept in ticks of 16 ms in 24 bits: a pin lasts its TTL and
 * at most two ticks more; ends compare within half the range (37 h), which
 * bounds the longest pin (config soft_pin_max_ttl, at most 36 h). */
#define KVP_PIN_TICK_MS 16u
#define KVP_PIN_BITS 24
#define KVP_PIN_KEEP ((1u << KVP_PIN_BITS) - 1) /* pending: keep the replaced pin */
#define KVP_PIN_MAX_TTL_MS ((uint64_t)((1u << (KVP_PIN_BITS - 1)) - 2) * KVP_PIN_TICK_MS)
/*
 * Flags. The SSD tier (master.h): ONDISK = segment slot disk_seg's node holds
 * a durable disk record of the object; SPILLING = that node is writing one
 * from the DRAM replica on disk_seg (the replicas stay until it is durable);
 * LOADING = the only replica is a staging allocation on disk_seg the node is
 * filling from its disk record (not readable until it reports LOADED).
 */
enum { KVP_OBJ_PINNED = 0x1, KVP_OBJ_ONDISK = 0x2, KVP_OBJ_SPILLING = 0x4, KVP_OBJ_LOADING = 0x8 };
/* READ: a READ descriptor was issued for it (exposed is the latest expiry) */
enum { KVP_OBJ_READ = 0x10 };
/* which list the prev/next links belong to */
enum {
    KVP_LIST_NONE = 0,
    KVP_LIST_PENDING,
    KVP_LIST_LEASED,
    KVP_LIST_LRU,
    KVP_LIST_DISKIO, /* unleased, SPILLING or LOADING: waiting for the node */
    KVP_LIST_DISK,   /* unleased, no DRAM replica, ONDISK: only on disk */
    KVP_LIST_SOFT,   /* unleased, evictable, soft-pinned: evicted after LRU */
};

/* One replica: allocation of npages(size) pages at `page` in segment slot
 * `seg`, generation `gen` of that segment's allocator. */
typedef struct kvp_orep {
    uint32_t seg;
    uint32_t page;
    uint32_t gen;
} kvp_orep;

typedef struct kvp_obj {
    struct kvp_obj *prev, *next; /* list links, see `list` */
    uint64_t size : 32;          /* value bytes (< KVP_OBJ_MAX_SIZE; max_object_size < 4 GiB) */
    uint64_t pin_until : 24;     /* soft pin: its end in KVP_PIN_TICK_MS ticks,
                                    wrapping; pending: the asked TTL in ticks,
                                    or KVP_PIN_KEEP (master.c pin_*) */
    uint64_t blk : 1;            /* the record holds a block hash (kvp_obj_blk) */
    uint64_t ev_dram : 1;        /* counted as a part of its block in DRAM in the
                                    events published (master/kvblk.c) */
    uint64_t ev_disk : 1;        /* ditto, on disk */
    uint64_t group : 5;          /* blk: the engine's KV cache group */
    uint64_t checksum;           /* set by PUT_END; pending with blk: the
                                    parent block's hash (kvblk.c) */
    uint32_t hash;               /* low 32 bits of the index hash */
    uint32_t deadline;           /* ms, wrapping: put deadline (pending) or
                                    lease expiry (leased) */
    uint32_t aux;                /* pending: writer client slot;
                                    complete: read leases, and how many of
                                    them are lookup holds (master.c
                                    lease_count / lease_holds) */
    uint32_t lease_seq;          /* lease id of the current lease epoch */
    uint16_t tenant;
    uint16_t keylen;
    uint8_t state : 2;           /* KVP_OBJ_PENDING / KVP_OBJ_COMPLETE */
    uint8_t nrep : 2;            /* replicas in use (<= KVP_MAX_REPLICAS) */
    uint8_t rep_cap : 2;         /* replicas allocated in the record (ditto) */
    /* soft pin (complete): until pin_until the object is evicted only after
     * its tenant's unpinned ones (KVP_LIST_SOFT); pending: the PUT_START
     * asked for one of pin_until ticks */
    uint8_t softpin : 1;
    uint8_t replacing : 1;       /* pending replacement: in m->repl, not m->ix */
    uint8_t flags : 5;           /* KVP_OBJ_* */
    uint8_t list : 3;            /* KVP_LIST_* */
    uint16_t disk_seg;           /* ONDISK / SPILLING / LOADING: the node's segment
                                    slot (< max_segments <= 65535) */
    uint32_t exposed;            /* ms, wrapping: pending: its WRITE descriptors'
                                    expiry; complete: its publication, or with
                                    KVP_OBJ_READ the latest READ descriptor's
                                    expiry (master.c exposed()) */
    uint32_t disk_rec;           /* ONDISK: which record of the key disk_seg's node
                                    holds (proto.h `rec`); FORGET names it */
} kvp_obj;
_Static_assert(sizeof(kvp_obj) == 64, "kvp_obj is 64 bytes (the per-object budget)");
_Static_assert(KVP_MAX_REPLICAS <= 3 && KVP_OBJ_COMPLETE <= 3, "nrep, rep_cap, state: 2 bits");

#define KVP_OBJ_BLK_BYTES 8u /* the block hash after the header */

static inline const uint8_t *kvp_obj_key(const kvp_obj *o)
{
    return (const uint8_t *)(o + 1) + (o->blk ? KVP_OBJ_BLK_BYTES : 0);
}

/* The block hash (o->blk only). */
static inline uint64_t kvp_obj_blk(const kvp_obj *o)
{
    uint64_t h;
    memcpy(&h, o + 1, sizeof h);
    return h;
}

static inline size_t kvp_obj_rep_off(uint16_t keylen, int blk)
{
    return (sizeof(kvp_obj) + (blk ? KVP_OBJ_BLK_BYTES : 0) + keylen + 3u) & ~(size_t)3u;
}

static inline kvp_orep *kvp_obj_reps(kvp_obj *o)
{
    return (kvp_orep *)((uint8_t *)o + kvp_obj_rep_off(o->keylen, o->blk));
}

static inline size_t kvp_obj_bytes(uint16_t keylen, uint8_t rep_cap, int blk)
{
    return kvp_obj_rep_off(keylen, blk) + (size_t)rep_cap * sizeof(kvp_orep);
}

/* The record's size as allocated. */
static inline size_t kvp_obj_size(const kvp_obj *o)
{
    return kvp_obj_bytes(o->keylen, o->rep_cap, o->blk);
}

static inline uint32_t kvp_pages(uint64_t size) { return (uint32_t)((size + 4095u) >> 12); }

#endif
