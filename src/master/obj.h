/*
 * obj.h -- the master's object record (internal to src/master).
 *
 * One record per object, allocated with kvp_salloc in one piece:
 *   [struct kvp_obj 72 B][key bytes][pad to 4][kvp_orep x rep_cap]
 * For a 100-byte key and one replica that is 184 bytes (192 with malloc's
 * overhead), the bulk of the <= 200 B/object budget.
 *
 * Field ownership: the master loop thread only.
 */
#ifndef KVP_OBJ_H
#define KVP_OBJ_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum { KVP_OBJ_PENDING = 1, KVP_OBJ_COMPLETE = 2 };
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
    uint64_t size;               /* value bytes */
    uint64_t checksum;           /* set by PUT_END */
    uint32_t hash;               /* low 32 bits of the index hash */
    uint32_t deadline;           /* ms, wrapping: put deadline (pending) or
                                    lease expiry (leased) */
    uint32_t aux;                /* pending: writer client slot;
                                    complete: number of read leases */
    uint32_t lease_seq;          /* lease id of the current lease epoch */
    uint16_t tenant;
    uint16_t keylen;
    uint8_t state : 2;           /* KVP_OBJ_PENDING / KVP_OBJ_COMPLETE */
    /* soft pin (complete): pin_until is the pin's end; the object is
     * evicted only after its tenant's unpinned ones (KVP_LIST_SOFT).
     * Pending: the PUT_START asked to soft-pin for pin_until ms. */
    uint8_t softpin : 1;
    uint8_t pin_keep : 1;        /* pending replacement: keep the old object's pin */
    uint8_t replacing : 1;       /* pending replacement: in m->repl, not m->ix */
    uint8_t nrep;                /* replicas in use */
    uint8_t rep_cap;             /* replicas allocated in the record */
    uint8_t flags : 5;           /* KVP_OBJ_* */
    uint8_t list : 3;            /* KVP_LIST_* */
    uint32_t disk_seg;           /* ONDISK / SPILLING / LOADING: the node's segment slot */
    uint32_t exposed;            /* ms, wrapping: pending: its WRITE descriptors'
                                    expiry; complete: its publication, or with
                                    KVP_OBJ_READ the latest READ descriptor's
                                    expiry (master.c exposed()) */
    uint32_t pin_until;          /* ms, wrapping: see softpin */
} kvp_obj;

static inline const uint8_t *kvp_obj_key(const kvp_obj *o) { return (const uint8_t *)(o + 1); }

static inline size_t kvp_obj_rep_off(uint16_t keylen)
{
    return (sizeof(kvp_obj) + keylen + 3u) & ~(size_t)3u;
}

static inline kvp_orep *kvp_obj_reps(kvp_obj *o)
{
    return (kvp_orep *)((uint8_t *)o + kvp_obj_rep_off(o->keylen));
}

static inline size_t kvp_obj_bytes(uint16_t keylen, uint8_t rep_cap)
{
    return kvp_obj_rep_off(keylen) + (size_t)rep_cap * sizeof(kvp_orep);
}

static inline uint32_t kvp_pages(uint64_t size) { return (uint32_t)((size + 4095u) >> 12); }

#endif
